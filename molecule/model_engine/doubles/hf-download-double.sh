#!/bin/sh
# TEST DOUBLE of the engine venv's python for the weight download (zerolayer.fleet molecule
# model_engine): called as `python -c SCRIPT REPO REVISION LOCAL_DIR`, it runs no Python and
# reaches no hub. It records who ran it with which settings (the token file's path and whether
# it could read it, never its content) beside LOCAL_DIR and writes a tiny model directory
# into LOCAL_DIR. tests/unit/roles/model_engine/test_model_engine_weights.py runs it too.
set -eu
repo=$3
revision=$4
local_dir=$5
if [ -r "${HF_TOKEN_PATH:-/nonexistent}" ]; then token_readable=yes; else token_readable=no; fi
printf 'repo=%s revision=%s local_dir=%s uid=%s hf_endpoint=%s hf_token_path=%s token_readable=%s hf_hub_offline=%s\n' \
  "$repo" "$revision" "$local_dir" "$(id -u)" "${HF_ENDPOINT:-}" "${HF_TOKEN_PATH:-}" \
  "$token_readable" "${HF_HUB_OFFLINE:-}" >>"$(dirname "$local_dir")/hf-download-double.log"
printf '{"model_type": "llama", "zerolayer_test_double": true}\n' >"$local_dir/config.json"
