#!/usr/bin/env bash
# Builds the sandbox node image: Debian 12 with systemd as PID 1 and every package the
# roles install, made from debootstrap because no container registry can be reached.
#
#   build-node-image.sh IMAGE_REF
#
# The Debian mirror is read from this machine's own apt sources at run time, so the image
# uses whatever mirror (or local proxy/snapshot) the machine already trusts.
set -euo pipefail

image_ref=${1:?usage: build-node-image.sh IMAGE_REF}
here=$(cd "$(dirname "$0")" && pwd)
suite=bookworm

# Prints the URI of the first apt source that serves SUITE (deb822 files first, then
# one-line sources.list entries). Prints nothing when none does.
apt_source_uri() {
  local want=$1 file
  for file in /etc/apt/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    # deb822: stanzas separated by blank lines; keep URIs of stanzas whose Suites has WANT.
    awk -v want="$want" '
      BEGIN { RS = ""; FS = "\n" }
      {
        uri = ""; hit = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri = a[2] }
          if ($i ~ /^Suites:/) { n = split($i, s, /[ \t]+/); for (j = 2; j <= n; j++) if (s[j] == want) hit = 1 }
        }
        if (hit && uri != "") { print uri; exit }
      }' "$file"
  done
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$file" ] || continue
    # one-line: deb [options] URI SUITE COMPONENTS...
    sed -E 's/\[[^]]*\]//' "$file" | awk -v want="$want" '$1 == "deb" && $3 == want { print $2; exit }'
  done
}

mirror=$(apt_source_uri "$suite" | head -n1)
security=$(apt_source_uri "$suite-security" | head -n1)
if [ -z "$mirror" ]; then
  echo "build-node-image: no apt source for suite '$suite' in /etc/apt; add one (deb822 or sources.list)" >&2
  exit 1
fi

packages=$(grep -Ev '^[[:space:]]*(#|$)' "$here/node-packages.txt" | tr '\n' ',' | sed 's/,$//')
workdir=$(mktemp -d /var/tmp/zerolayer-node-build.XXXXXX)
rootfs=$workdir/rootfs
cleanup() {
  # debootstrap may leave /proc or /sys mounted in the rootfs when it fails half-way.
  for m in "$rootfs/proc" "$rootfs/sys" "$rootfs/dev/pts" "$rootfs/dev"; do
    if mountpoint -q "$m" 2>/dev/null; then umount -l "$m" || true; fi
  done
  rm -rf --one-file-system "$workdir"
}
trap cleanup EXIT

# Downloaded .debs are kept between builds: a recipe change then costs no downloads.
cache=${ZEROLAYER_DEBOOTSTRAP_CACHE:-$here/../../.cache/debootstrap}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

echo "build-node-image: debootstrap $suite from $mirror"
debootstrap --variant=minbase --cache-dir="$cache" --include="$packages" \
  "$suite" "$rootfs" "$mirror" >"$workdir/debootstrap.log" 2>&1 || {
  tail -n 40 "$workdir/debootstrap.log" >&2
  exit 1
}

# apt sources inside the node: the same mirror, in deb822 form. The package lists are kept
# in the image so `apt: state=present` works in a role without update_cache.
rm -f "$rootfs/etc/apt/sources.list"
{
  printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' "$mirror" "$suite" "$suite"
  printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  if [ -n "$security" ]; then
    printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' "$security" "$suite"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  fi
} >"$rootfs/etc/apt/sources.list.d/debian.sources"

cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C \
  /bin/sh -s <"$here/node-rootfs-setup.sh"
# podman writes the node's own resolv.conf and hostname at start.
rm -f "$rootfs/etc/resolv.conf" "$rootfs/etc/hostname"

echo "build-node-image: importing $image_ref"
tar -C "$rootfs" --numeric-owner -c . | podman import --quiet \
  --change 'CMD ["/sbin/init"]' \
  --change 'STOPSIGNAL SIGRTMIN+3' \
  --change 'ENV container=podman' \
  --change 'LABEL zerolayer.sandbox=node-image' \
  - "$image_ref" >/dev/null
