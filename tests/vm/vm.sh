# Guest harness, host side: Debian's kernel (extracted, never installed), an
# uncompressed initramfs of Debian binaries, and a qemu boot.  Source it.
# Everything built is cached under $VM_CACHE keyed by the kernel package's
# file name, so a second run only concatenates a small cpio of scripts.

: "${VM_CACHE:=/var/tmp/blkd-vm}"
VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The guest's tools: Debian binaries from this host, libraries found by ldd.
VM_BINS=(/usr/sbin/nbd-client /usr/bin/fio /usr/sbin/mke2fs /usr/sbin/e2fsck
         /usr/sbin/blkdiscard /usr/sbin/blockdev)
# Modules the guest loads (with their dependencies, in dependency order).
VM_MODULES=(virtio_pci virtio_net nbd ext4 crc32c_generic)

vm_log() { echo "vm: $*" >&2; }

# vm_can_run: 0 when qemu can boot a guest here; otherwise prints why.
vm_can_run() {
  command -v qemu-system-x86_64 >/dev/null 2>&1 || { echo "qemu-system-x86_64 is not installed"; return 1; }
  command -v busybox >/dev/null 2>&1 || [ -x /bin/busybox ] || { echo "busybox is not installed"; return 1; }
  command -v cpio >/dev/null 2>&1 || { echo "cpio is not installed"; return 1; }
  local b
  for b in "${VM_BINS[@]}"; do [ -x "$b" ] || { echo "$b is missing"; return 1; }; done
  command -v apt-get >/dev/null 2>&1 || [ -n "$(ls "$VM_CACHE"/linux-image-*.deb 2>/dev/null)" ] ||
    { echo "no apt-get to fetch Debian's kernel and none cached in $VM_CACHE"; return 1; }
  return 0
}

# vm_accel: KVM only where it is real hardware virtualisation; under PVM
# (nested, page-table based) a stock kernel crawls or dies, so TCG.
vm_accel() {
  if [ -n "${VM_ACCEL:-}" ]; then echo "$VM_ACCEL"; return; fi
  if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then echo kvm; else echo tcg; fi
}

# vm_kernel: fetch and extract Debian's kernel package once; sets VM_KVER,
# VM_KROOT (the extracted tree) and VM_VMLINUZ.
vm_kernel() {
  mkdir -p "$VM_CACHE"
  local pkg deb
  pkg=${VM_KERNEL_PKG:-$(apt-cache depends linux-image-amd64 2>/dev/null |
                         sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1)}
  if [ -z "$pkg" ]; then
    deb=$(ls -t "$VM_CACHE"/linux-image-[0-9]*-amd64_*.deb 2>/dev/null | head -n1)
  else
    deb=$(ls -t "$VM_CACHE"/"${pkg}"_*.deb 2>/dev/null | head -n1)
    if [ -z "$deb" ]; then
      vm_log "fetching $pkg"
      (cd "$VM_CACHE" && timeout 300 apt-get download "$pkg") >&2 || return 1
      deb=$(ls -t "$VM_CACHE"/"${pkg}"_*.deb | head -n1)
    fi
  fi
  [ -n "$deb" ] || { vm_log "no kernel package"; return 1; }
  VM_KROOT=$VM_CACHE/$(basename "$deb" .deb)
  if [ ! -e "$VM_KROOT/.done" ]; then
    vm_log "extracting $(basename "$deb")"
    rm -rf "$VM_KROOT"; mkdir -p "$VM_KROOT"
    timeout 300 dpkg-deb -x "$deb" "$VM_KROOT" || return 1
    touch "$VM_KROOT/.done"
  fi
  VM_VMLINUZ=$(ls "$VM_KROOT"/boot/vmlinuz-* | head -n1)
  VM_KVER=${VM_VMLINUZ##*/vmlinuz-}
}

# modinfo without kmod: a module's .modinfo section holds "depends=a,b".
vm_mod_path() { find "$VM_KROOT/lib/modules/$VM_KVER/kernel" -name "$1.ko" -o -name "$1.ko.xz" | head -n1; }
vm_mod_depends() {
  objcopy -O binary --only-section=.modinfo "$(vm_mod_path "$1")" /dev/stdout |
    tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' '
}

# vm_mod_order NAME...: NAME and what it depends on, dependencies first, once each.
vm_mod_order() {
  local m d
  for m in "$@"; do
    [ -n "${VM_SEEN[$m]:-}" ] && continue
    VM_SEEN[$m]=1
    [ -n "$(vm_mod_path "$m")" ] || { vm_log "module $m not in the kernel package"; return 1; }
    for d in $(vm_mod_depends "$m"); do vm_mod_order "$d" || return 1; done
    echo "$m"
  done
}

# vm_base: the cached base initramfs (binaries, libraries, modules); sets VM_BASE.
vm_base() {
  vm_kernel || return 1
  VM_BASE=$VM_CACHE/initramfs-$VM_KVER.cpio
  local stamp; stamp=$(cat "$VM_DIR/vm.sh" "${VM_BINS[@]}" | sha1sum | cut -c1-12)
  if [ -e "$VM_BASE" ] && [ "$(cat "$VM_BASE.stamp" 2>/dev/null)" = "$stamp" ]; then return 0; fi
  vm_log "building the base initramfs"
  local root; root=$(mktemp -d "$VM_CACHE/root.XXXXXX")
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,mnt,run,lib/modules,vm}
  cp "$(command -v busybox || echo /bin/busybox)" "$root/bin/busybox"
  local b lib
  for b in "${VM_BINS[@]}"; do
    cp "$b" "$root$b"
    for lib in $(ldd "$b" | awk '/=>/ { print $3 } /^\t\/lib/ { print $1 }'); do
      [ -e "$root$lib" ] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
    done
  done
  ln -sf mke2fs "$root/usr/sbin/mkfs.ext4"
  [ -e /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$root/etc/"
  # ldd reports /lib/x86_64-linux-gnu; merged-/usr Debian resolves both.
  [ -e "$root/lib64/ld-linux-x86-64.so.2" ] || { mkdir -p "$root/lib64"; cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"; }
  echo 'root:x:0:0:root:/:/bin/sh' >"$root/etc/passwd"
  echo 'root:x:0:' >"$root/etc/group"
  local -A VM_SEEN=()
  local order; order=$(vm_mod_order "${VM_MODULES[@]}") || { rm -rf "$root"; return 1; }
  local m
  for m in $order; do cp "$(vm_mod_path "$m")" "$root/lib/modules/"; done
  echo "$order" >"$root/lib/modules/order"
  (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$VM_BASE.tmp" || { rm -rf "$root"; return 1; }
  rm -rf "$root"
  mv "$VM_BASE.tmp" "$VM_BASE"
  echo "$stamp" >"$VM_BASE.stamp"
}

# vm_initrd OUT FILES...: the base initramfs plus a second archive holding
# the guest's scripts (tests/vm/guest/*) and FILES under /vm/ (the kernel
# unpacks concatenated cpio archives in turn).
vm_initrd() {
  local out=$1; shift
  local d; d=$(mktemp -d "${TMPDIR:-/tmp}/vm-extra.XXXXXX")
  mkdir -p "$d/vm"
  cp "$VM_DIR"/guest/* "$d/vm/"
  mv "$d/vm/init" "$d/init"
  local f; for f in "$@"; do cp -r "$f" "$d/vm/"; done
  chmod 755 "$d/init"
  { cat "$VM_BASE"; (cd "$d" && find . | LC_ALL=C sort | cpio -o -H newc --quiet); } >"$out"
  rm -rf "$d"
}

# vm_boot INITRD CONSOLE_LOG TIMEOUT [KERNEL ARGS...]: boots the guest, its
# serial console to CONSOLE_LOG; returns qemu's status (124: timed out).
# VM_NET overrides the network (default: user networking on 192.0.2.0/24,
# where 192.0.2.2 is the host's 127.0.0.1).  VM_MEM, VM_CPUS likewise;
# VM_QEMU_ARGS adds qemu options (-pidfile FILE); VM_WRAP prefixes the
# command (ip netns exec NS).
vm_boot() {
  local initrd=$1 log=$2 secs=$3; shift 3
  local accel; accel=$(vm_accel)
  # qemu's user networking on a documentation range: 192.0.2.2 is the
  # host's loopback as seen from the guest.
  local net=${VM_NET:--netdev user,id=n0,net=192.0.2.0/24,host=192.0.2.2 -device virtio-net-pci,netdev=n0}
  local cpu=max; [ "$accel" = kvm ] && cpu=host
  # shellcheck disable=SC2086
  ${VM_WRAP:-} timeout -k 5 "$secs" qemu-system-x86_64 -machine q35,accel="$accel" -cpu "$cpu" \
    -smp "${VM_CPUS:-2}" -m "${VM_MEM:-768M}" -nographic -no-reboot -nodefaults \
    -serial "file:$log" -display none -monitor none \
    -kernel "$VM_VMLINUZ" -initrd "$initrd" \
    -append "console=ttyS0 quiet panic=-1 $*" $net ${VM_QEMU_ARGS:-} </dev/null
}
