#!/bin/sh
# TEST DOUBLE of the router's registration command: it records how it was called, by
# whom, and whether the engine's port was already listening, then succeeds.
set -eu
port=$3
if ss -Hltn "sport = :$port" | grep -q .; then listening=yes; else listening=no; fi
printf 'args=%s uid=%s listening=%s\n' "$*" "$(id -u)" "$listening" \
  >>/run/zerolayer-register-engine-double.log
