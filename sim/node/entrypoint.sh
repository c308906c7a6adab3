#!/bin/bash
# Entrypoint of a simulated DGX Spark node (a container of the sparkops test bed).
#
# Docker names interfaces eth0, eth1, ... in the order networks are connected;
# a Spark names them enP7s7 (10GbE management) and enp1s0f1np1 /
# enP2p1s0f1np1 (the two PCIe functions, "twins", of one QSFP port). Renaming
# here lets the roles run against the same interface names as on real hardware.
# SIM_IFACES holds "address=name" pairs; we wait (bounded) for each address to
# appear, since `docker network connect` happens after the container starts.
set -u

rename_ifaces() {
    local pair addr name dev deadline
    for pair in ${SIM_IFACES:-}; do
        addr=${pair%%=*}
        name=${pair##*=}
        deadline=$((SECONDS + 60))
        # Docker may still be renaming the link (veth* -> eth*) when its address shows: a rename
        # of the old name then fails, so look again until the link carries our name.
        while :; do
            dev=$(ip -o -4 addr show | awk -v a="$addr" '{split($4, p, "/"); if (p[1] == a) print $2}')
            dev=${dev%%@*}
            [ -n "$dev" ] && [ "$dev" = "$name" ] && break
            if [ -n "$dev" ]; then
                ip link set dev "$dev" down 2>/dev/null \
                    && ip link set dev "$dev" name "$name" 2>/dev/null
            fi
            if [ "$SECONDS" -ge "$deadline" ]; then
                echo "sim-node: address $addr is on '${dev:-no link}', could not name it $name in 60 s" >&2
                return 1
            fi
            sleep 0.2
        done
        ip link set dev "$name" up
    done
    # Docker drops addresses of a renamed link's routes; make sure each is still there.
    for pair in ${SIM_IFACES:-}; do
        addr=${pair%%=*}
        ip -o -4 addr show | grep -q " $addr/" || echo "sim-node: address $addr lost after rename" >&2
    done
}

# Without --privileged, Docker mounts the cgroup v1 hierarchies read-only and the
# node's own dockerd cannot make cgroups for its containers. With CAP_SYS_ADMIN
# we may mount them afresh, read-write (what Docker's own dind script does).
remount_cgroups() {
    local line mnt opts subsys
    # Read the list first: /proc/mounts changes under a reader as we remount.
    local -a lines
    mapfile -t lines < <(awk '$3 == "cgroup" && $4 ~ /(^|,)ro(,|$)/ {print $2, $4}' /proc/mounts)
    for line in "${lines[@]}"; do
        mnt=${line%% *}
        opts=${line#* }
        subsys=$(echo "$opts" | tr ',' '\n' | grep -vxE 'ro|rw|nosuid|nodev|noexec|relatime' | paste -sd, -)
        umount "$mnt" && mount -t cgroup -o "$subsys" cgroup "$mnt" \
            || echo "sim-node: could not remount $mnt read-write" >&2
    done
}

rename_ifaces || exit 1
if [ "$(stat -fc %T /sys/fs/cgroup)" = tmpfs ]; then
    remount_cgroups
fi
echo "sim-node: interfaces ready" > /run/sim-node.ready

# Fresh host keys per node, kept across container restarts.
if [ ! -s /etc/ssh/ssh_host_ed25519_key ]; then
    ssh-keygen -A >/dev/null
fi
mkdir -p /root/.ssh /run/sshd
chmod 700 /root/.ssh
# Add the control key, keep what the deployment authorised (fabric_ssh): a real Spark keeps its
# authorized_keys across a reboot, so a node that comes back must too.
if [ -f /sim/authorized_keys ]; then
    touch /root/.ssh/authorized_keys
    chmod 600 /root/.ssh/authorized_keys
    grep -qxF -f /sim/authorized_keys /root/.ssh/authorized_keys || cat /sim/authorized_keys >> /root/.ssh/authorized_keys
fi

# What a Spark's boot unit does before Docker starts (roles/firewall_boot: sparkops-firewall.service,
# Before=docker.service): the SPARKOPS chains back from their rules files, for IPv4 and IPv6. This node
# runs no init system, so its entrypoint runs the same script at the same point of its boot.
if [ -x /etc/init.d/sparkops-firewall ]; then
    /etc/init.d/sparkops-firewall start || echo "sim-node: the firewall restore failed" >&2
fi

# The node's own Docker engine (Docker-in-Docker); its data lives on a volume.
mkdir -p /var/log
# A cgroup parent of its own keeps this node's containers apart from the
# outer engine's and the other node's in the shared cgroup v1 hierarchy.
dockerd --host unix:///var/run/docker.sock --cgroup-parent "/sparkops-sim/$(hostname)" \
    >/var/log/dockerd.log 2>&1 &

exec /usr/sbin/sshd -D -e
