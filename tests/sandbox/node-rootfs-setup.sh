# shellcheck shell=sh
# Runs inside the node rootfs (chroot, /bin/sh) while the image is built.
set -eu
export DEBIAN_FRONTEND=noninteractive

# Package scripts must not start daemons in the build chroot (it shares the host network).
printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
chmod 755 /usr/sbin/policy-rc.d

apt-get update -qq
# debootstrap installs from the release suite only; take the point and security updates
# too, so a role asking for state=latest finds nothing to do either.
apt-get -y -qq -o Dpkg::Options::=--force-confold dist-upgrade >/dev/null

# Units that cannot work in a container, or whose failure would leave the node
# "degraded" for no reason: consoles, hardware, binfmt. systemd-sysctl is masked because
# a privileged container shares the host's kernel.*, vm.* and fs.* sysctls and the
# defaults it would apply at boot (/usr/lib/sysctl.d) would change the host.
for unit in \
  getty@.service serial-getty@.service console-getty.service getty.target \
  systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
  systemd-udev-trigger.service systemd-udev-settle.service \
  systemd-modules-load.service systemd-sysctl.service \
  systemd-remount-fs.service systemd-firstboot.service \
  sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount \
  proc-sys-fs-binfmt_misc.automount systemd-binfmt.service \
  apt-daily.timer apt-daily-upgrade.timer; do
  ln -sf /dev/null "/etc/systemd/system/$unit"
done

# A node starts with nothing listening: legacy_proxy, prometheus_server and rollout_store
# enable their own services (Debian's etcd-server enables etcd.service on install, which
# would run a stray single-node etcd on every GPU node).
for unit in nginx.service prometheus.service etcd.service; do
  systemctl disable "$unit" >/dev/null 2>&1 || true
done

# A real host has bpffs at /sys/fs/bpf because systemd mounts it as an API file system
# early at boot; systemd skips that inside a container and refuses a .mount unit for an API
# path, so a oneshot service gives the node the same starting point.
cat >/etc/systemd/system/sandbox-bpffs.service <<'UNIT'
[Unit]
Description=Mount the BPF file system like systemd does on a host
DefaultDependencies=no
Before=local-fs.target
ConditionPathIsMountPoint=!/sys/fs/bpf

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount -t bpf -o rw,nosuid,nodev,noexec,relatime,mode=700 bpf /sys/fs/bpf

[Install]
WantedBy=local-fs.target
UNIT
systemctl enable sandbox-bpffs.service >/dev/null 2>&1

# Ansible reaches a node over SSH, as root with a key only: the key pair is made on the
# controller (scripts/sandbox) and the public half is mounted as root's authorized_keys
# when a node starts. The host keys baked here are the same on every node; the sandbox's
# inventory does not pin them (tests/sandbox/README.md).
cat >/etc/ssh/sshd_config.d/zerolayer-sandbox.conf <<'CONF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
CONF
systemctl enable ssh.service >/dev/null 2>&1

# Each container gets its own machine id at first boot.
: >/etc/machine-id
rm -f /var/lib/dbus/machine-id

apt-get clean
rm -f /usr/sbin/policy-rc.d
rm -rf /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log /tmp/* /var/tmp/*
