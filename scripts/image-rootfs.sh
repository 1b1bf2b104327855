#!/bin/sh
# Assembles kpng's container root file system from a Debian system (the Dockerfile's build
# stage, bookworm): the kpng binary, and exactly the tools it runs with the shared libraries
# they load, nothing else. The image is then `FROM scratch` plus this tree: no shell, no
# package manager, nothing kpng does not use.
#
#   scripts/image-rootfs.sh KPNG_BINARY ROOT
#
# What goes in, and why:
# - /usr/local/bin/kpng, and /usr/local/bin/kube-proxy → kpng: a kubeadm kube-proxy
#   DaemonSet runs `/usr/local/bin/kube-proxy --config=… --hostname-override=…`, so
#   replacing only its image switches a node to kpng (docs/deploy.md).
# - nft and libnftables (the nftables backend loads libnftables in process and runs
#   `nft -f -` for whole-table transactions; the userspace proxy's capture uses nft).
# - iptables-{nft,legacy}{,-save,-restore} and ip6tables-…: the iptables backend, the removal
#   of kube-proxy's chains, `--dry-run`'s `iptables-restore --test`; with the xtables
#   extensions their rules use.
# - ip (iproute2): removing kube-proxy's ipvs-mode interface (kube-ipvs0).
# - CA certificates, /etc/protocols and /etc/services (iptables resolves protocol names).
# The dynamic loader and every library these link are copied by the names `ldd` gives.
# `tests/deploy.rs` runs this script and the binaries it copied in a chroot.
set -eu

kpng=$1
root=$2

multiarch=$(gcc -dumpmachine 2>/dev/null || dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=/usr/lib/$multiarch

mkdir -p "$root/usr/local/bin" "$root/usr/sbin" "$root$libdir" "$root/etc/ssl/certs" \
    "$root/run" "$root/tmp" "$root/var/lib/kpng"
chmod 1777 "$root/tmp"
# Merged /usr, as Debian: /lib and /lib64 are links into /usr.
ln -sfn usr/lib "$root/lib"
if [ -d /usr/lib64 ]; then
    mkdir -p "$root/usr/lib64"
    ln -sfn usr/lib64 "$root/lib64"
fi

install -m 0755 "$kpng" "$root/usr/local/bin/kpng"
ln -sfn kpng "$root/usr/local/bin/kube-proxy"

cp /usr/sbin/nft /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi "$root/usr/sbin/"
for variant in nft legacy; do
    for tool in iptables ip6tables; do
        for suffix in "" -save -restore; do
            ln -sfn "xtables-$variant-multi" "$root/usr/sbin/$tool-$variant$suffix"
        done
    done
done
ip=$(command -v ip || true)
if [ -n "$ip" ]; then
    cp "$ip" "$root/usr/sbin/ip"
fi
cp -r "$libdir/xtables" "$root$libdir/"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
for f in /etc/protocols /etc/services; do
    if [ -f "$f" ]; then cp "$f" "$root/etc/"; fi
done

# Every library the binaries, libnftables (loaded at run time) and the xtables extensions
# link, by the name the loader looks for; /lib and /lib64 paths land under /usr.
libs() {
    ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
}
{
    for f in "$root/usr/local/bin/kpng" "$root/usr/sbin/nft" "$root/usr/sbin/xtables-nft-multi" \
        "$root/usr/sbin/xtables-legacy-multi" "$libdir/libnftables.so.1" "$libdir"/xtables/*.so; do
        libs "$f"
    done
    if [ -n "$ip" ]; then libs "$ip"; fi
    echo "$libdir/libnftables.so.1"
} | sort -u | while read -r lib; do
    dest=$(echo "$lib" | sed 's#^/lib/#/usr/lib/#; s#^/lib64/#/usr/lib64/#')
    mkdir -p "$root$(dirname "$dest")"
    cp -L "$lib" "$root$dest"
done
