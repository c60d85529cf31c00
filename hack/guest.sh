#!/usr/bin/env bash
# Builds the guest that test/framework/vmtest boots under QEMU: a Debian cloud
# kernel and a busybox initramfs whose /init configures eth0 from the kernel
# command line and reports on the serial console. Once per machine; prints the
# folder that holds vmlinuz and initrd.gz. Cached outside the work tree, in a
# folder named after what went into it (kernel package and version, busybox
# version, this script), so that a new kernel, busybox or /init builds a new
# guest. Safe to run concurrently: one build at a time under a lock, and a
# guest appears in the cache only when complete (built aside, then renamed).
#
# Debian packages only: the kernel comes from `apt-get download` (nothing is
# installed into the host's /boot), busybox from busybox-static.
set -euo pipefail

CACHE=${GALACTICTEST_GUEST_CACHE:-/var/cache/galactic-node/guest}
# The kernel: a meta-package (resolved to the image it depends on) or an
# image package. The cloud flavour is the smallest Debian builds, and it has
# virtio-net and the 8250 serial console.
KERNEL=${GALACTICTEST_GUEST_KERNEL:-linux-image-cloud-amd64}
# What the guest's NIC needs; their dependencies follow from the modules.
NIC_MODULES=(virtio_pci virtio_net)
# Printed by `apt-get download` when _apt cannot write the folder (root's
# mktemp folders are 0700); the download works either way.
APT_OPTS=(-qq -o APT::Sandbox::User=root)

log() { echo "guest.sh: $*" >&2; }

need_root() {
	if [ "$(id -u)" != 0 ]; then
		log "$1: run as root"
		exit 1
	fi
}

# The image package a name stands for: the meta-package's dependency, and its
# -unsigned twin when the archive has one (same kernel, without the signature
# a direct -kernel boot does not need).
resolve_kernel() {
	local pkg=$KERNEL dep found
	# Readers take all their input (no head, no grep -m): under pipefail, a
	# writer cut off by SIGPIPE would fail the lookup.
	dep=$(apt-cache depends "$pkg" 2>/dev/null |
		awk '/^ *Depends: linux-image-[^ <>]*$/ && !f {print $2; f=1}') || true
	[ -n "$dep" ] && pkg=$dep
	# One apt-cache call for both (each takes seconds where apt keeps no
	# binary cache), the -unsigned one first; apt-cache fails when one of
	# them does not exist.
	found=$(apt-cache show --no-all-versions "${pkg%-unsigned}-unsigned" "$pkg" 2>/dev/null |
		awk '/^Package: /{p=$2} /^Version: / && !f {print p, $2; f=1}') || true
	[ -n "$found" ] || return 1
	echo "$found"
}

if ! resolved=$(resolve_kernel); then
	need_root "apt-get update (no package $KERNEL in the apt lists)"
	log "no $KERNEL in the apt lists: apt-get update"
	apt-get update -qq >&2
	resolved=$(resolve_kernel) || {
		log "no kernel package $KERNEL in the apt sources"
		exit 1
	}
fi
read -r kpkg kversion <<<"$resolved"

# busybox-static, not busybox: the initramfs has no libc. cpio packs it.
if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' ||
	! command -v cpio >/dev/null; then
	need_root "install busybox-static and cpio"
	log "installing busybox-static and cpio"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static cpio >&2
fi
bbversion=$(dpkg-query -W -f='${Version}' busybox-static)
BUSYBOX=$(dpkg -L busybox-static | awk '/\/busybox$/ && !f {print; f=1}')

key=$( (echo "$kpkg $kversion busybox-static $bbversion" && cat "$0") | sha256sum | cut -c1-12)
OUT="$CACHE/${kpkg#linux-image-}-$key"

if [ -f "$OUT/stamp" ]; then
	touch "$OUT" 2>/dev/null || true # last used: see the pruning below
	echo "$OUT"
	exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ -f "$OUT/stamp" ]; then # built while we waited for the lock
	echo "$OUT"
	exit 0
fi

start=$SECONDS
work=$(mktemp -d "$CACHE/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "building $OUT from $kpkg $kversion and busybox-static $bbversion"

(cd "$work" && apt-get download "${APT_OPTS[@]}" "$kpkg=$kversion" >&2)
dpkg-deb -x "$work"/*.deb "$work/pkg"
kdir=$(find "$work/pkg/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)
krelease=${kdir##*/}
vmlinuz="$work/pkg/boot/vmlinuz-$krelease"
[ -f "$vmlinuz" ] || {
	log "no boot/vmlinuz-$krelease in $kpkg"
	exit 1
}

root="$work/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,lib/modules,var/log}
cp "$BUSYBOX" "$root/bin/busybox"

# Modules go into the initramfs uncompressed, in load order (dependencies
# first) in /lib/modules/order: busybox insmod then needs no modules.dep and
# no decompressor. Debian 12 ships them plain; later kernels compress them.
declare -A loaded=()
order=()
add_module() {
	local name=$1 file dep
	[ -n "${loaded[$name]:-}" ] && return 0
	loaded[$name]=1
	# modules.builtin names files; a module's name may spell - as _.
	if grep -Eq "/(${name}|${name//_/-})\.ko$" "$kdir/modules.builtin"; then
		log "module $name: built into $krelease"
		return 0
	fi
	file=$(find "$kdir/kernel" \( -name "$name.ko*" -o -name "${name//_/-}.ko*" \) | head -n1)
	if [ -z "$file" ]; then
		log "module $name: neither built in nor shipped by $kpkg"
		exit 1
	fi
	local out="$root/lib/modules/$name.ko"
	case "$file" in
	*.ko) cp "$file" "$out" ;;
	*.ko.xz) "$BUSYBOX" unxz -c "$file" >"$out" ;;
	*.ko.gz) "$BUSYBOX" gunzip -c "$file" >"$out" ;;
	*.ko.zst) zstd -q -d -c "$file" >"$out" ;; # needs the zstd package
	*)
		log "module $name: unknown format $file"
		exit 1
		;;
	esac
	for dep in $(tr '\0' '\n' <"$out" | sed -n 's/^depends=//p' | head -n1 | tr ',' ' '); do
		add_module "$dep"
	done
	log "module $name: ${file#"$kdir/"}"
	order+=("$name")
}
for m in "${NIC_MODULES[@]}"; do
	add_module "$m"
done
printf '%s\n' "${order[@]}" >"$root/lib/modules/order"

cat >"$root/init" <<'INIT'
#!/bin/busybox sh
# /init of the vmtest guest (hack/guest.sh). Configuration comes from the
# kernel command line; results go to the serial console as GALACTIC-* lines,
# which test/framework/vmtest waits for:
#   galactic.ip=ADDR/LEN  eth0's address: GALACTIC-UP
#   galactic.gw=ADDR      arping it (GALACTIC-ARP-OK|FAIL), ping it (GALACTIC-PING-OK|FAIL)
#   galactic.udp=ADDR:PORT  five UDP datagrams "galactic-udp N" (GALACTIC-UDP-SENT)
# GALACTIC-INIT comes first, GALACTIC-DONE last; then the guest stays up,
# holding its NIC, until QEMU quits.
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
# Only the markers on the console from here on.
dmesg -n 1
echo "GALACTIC-INIT $(uname -r)"

while read -r m; do
	insmod "/lib/modules/$m.ko" || echo "GALACTIC-MODULE-FAIL $m"
done </lib/modules/order

addr= gw= udp=
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	galactic.ip=*) addr=${arg#*=} ;;
	galactic.gw=*) gw=${arg#*=} ;;
	galactic.udp=*) udp=${arg#*=} ;;
	esac
done

i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do
	usleep 100000
	i=$((i + 1))
done
ip link set lo up
if [ ! -e /sys/class/net/eth0 ]; then
	echo "GALACTIC-NIC-FAIL no eth0"
elif [ -n "$addr" ]; then
	ip link set eth0 up
	ip addr add "$addr" dev eth0
	echo "GALACTIC-UP eth0 $addr $(cat /sys/class/net/eth0/address)"
	if [ -n "$gw" ]; then
		if arping -f -c 5 -w 10 -I eth0 "$gw" >/dev/null; then
			echo "GALACTIC-ARP-OK $gw"
		else
			echo "GALACTIC-ARP-FAIL $gw"
		fi
		if ping -c 3 -W 2 "$gw" >/dev/null; then
			echo "GALACTIC-PING-OK $gw"
		else
			echo "GALACTIC-PING-FAIL $gw"
		fi
	fi
	if [ -n "$udp" ]; then
		# busybox's nc has no UDP; its syslogd forwards each message
		# logged to /dev/log as one datagram to -R HOST:PORT.
		syslogd -R "$udp"
		i=0
		while [ ! -S /dev/log ] && [ $i -lt 50 ]; do
			usleep 100000
			i=$((i + 1))
		done
		for n in 1 2 3 4 5; do
			logger -t galactic "galactic-udp $n"
		done
		echo "GALACTIC-UDP-SENT $udp"
	fi
fi
echo "GALACTIC-DONE"
while :; do
	sleep 3600
done
INIT
chmod 0755 "$root/init"

mkdir -p "$work/out"
(cd "$root" && find . -print0 | LC_ALL=C sort -z |
	cpio --null --create --format=newc --owner=0:0 --reproducible --quiet) |
	gzip -9n >"$work/out/initrd.gz"
cp "$vmlinuz" "$work/out/vmlinuz"
{
	echo "kernel $kpkg $kversion $krelease"
	echo "busybox-static $bbversion"
	echo "modules ${order[*]}"
} >"$work/out/stamp"
mv -T "$work/out" "$OUT"
# Guests of an older kernel or script, unused for a day (the fast path above
# touches the one it prints): nothing still starts QEMU on those.
find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name '.*' ! -path "$OUT" -mmin +1440 -exec rm -rf {} + || true
log "built $OUT in $((SECONDS - start)) s"
echo "$OUT"
