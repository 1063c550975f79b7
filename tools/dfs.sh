#!/usr/bin/env bash
# tools/dfs.sh — a two-node GlusterFS cluster on one machine, for tierkv's
# shared-store (multi-node) tests and measurements.
#
#   tools/dfs.sh up [--coherent|--defaults]   start (idempotent); prints "nN MOUNTPOINT" per node
#   tools/dfs.sh down                         tear everything down (idempotent)
#   tools/dfs.sh status                       exit 0 when up, 1 when down
#   tools/dfs.sh exec nN CMD [ARGS...]        run CMD "as node nN"
#
# Topology (all addresses private to this machine; nothing leaves it):
#
#   host: bridge tkvbr0 10.213.47.1/24 ── glusterd (one per host, TCP 24007,
#         bound to 10.213.47.1), two brick daemons (glusterfsd) and the
#         self-heal daemon, all on the bridge address; bricks under the state dir
#     ├─ veth tkv-n1h ⇄ tkv0 in netns tkv-n1, 10.213.47.11/24
#     └─ veth tkv-n2h ⇄ tkv0 in netns tkv-n2, 10.213.47.12/24
#
#   Volume "tierkv", replica 2, bricks 10.213.47.1:$STATE/bricks/b1 and .../b2.
#   Node nN mounts it with its own FUSE client process, started inside netns
#   tkv-nN (so its traffic goes 10.213.47.1N -> 10.213.47.1 over the bridge),
#   but in the host's mount namespace: the host sees /mnt/tierkv-dfs/n1 and
#   /mnt/tierkv-dfs/n2 as two independent clients of one volume.
#
# Modes (chosen at `up`; recorded in the state dir; change with down + up):
#   coherent (default)  performance.quick-read, performance.stat-prefetch and
#                       performance.open-behind off, performance.strict-o-direct
#                       on, and FUSE entry-timeout=0,attribute-timeout=0.
#                       Without these a client serves a name replaced by rename
#                       on another client with the OLD content for ~1 s, and
#                       open-behind turns cross-client unlinks into ENOENT/ESTALE
#                       at read/close (docs/shared-dfs-draft.md has the figures).
#                       strict-o-direct on makes write-behind pass O_DIRECT writes
#                       straight to the bricks, so an O_DIRECT write is on the
#                       bricks when write() returns and fails AT write() (not at a
#                       later fsync/close) — the semantics tierkv's direct I/O
#                       path assumes from local filesystems.
#   defaults            stock volume settings and stock FUSE timeouts (1 s), to
#                       measure what an untuned GlusterFS does.
#   Choose with `up --defaults` / `up --coherent` or TIERKV_DFS_MODE=defaults|coherent.
#
# What `up` creates, all of which `down` removes:
#   - state dir $STATE (default /var/tmp/tierkv-dfs): glusterd working dir (lib/),
#     run dir (run/: pid files, unix sockets), logs (log/), bricks (bricks/);
#   - netns tkv-n1, tkv-n2 (and /run/netns with its bind mount, when it did not
#     exist), veths tkv-n1h/tkv-n2h, bridge tkvbr0;
#   - /mnt/tierkv-dfs (a shared bind mount of itself, so mount/unmount events
#     propagate into `exec` nodes) and the two FUSE mounts under it;
#   - processes: glusterd, 2 x glusterfsd, glustershd, 2 x glusterfs (FUSE);
#   - whatever glusterd still writes outside its own dirs (brick logs under
#     /var/log/glusterfs, sockets under /run/gluster, ...): `up` records what was
#     in those dirs before, `down` removes everything that was not.
#
# Each node is a long-lived process tree: an init (bash) in netns tkv-nN, its own UTS
# namespace (host name tierkv-nN), its own PID namespace with its own /proc, and a mount
# namespace that is a slave of the host's (the volume mounts are the host's; mount changes
# propagate). `up` starts them, `down` kills them (and every process on them).
# `exec nN CMD...` runs CMD on node nN (nsenter into those namespaces): every command of
# one node sees the others' pids and the same host name, as processes of one machine do.
# Environment, cwd, stdin/stdout/stderr and the exit status pass through. SIGKILL to the
# exec process kills CMD (a crash of that process on its node); other signals reach nsenter,
# which passes them on.
#
# Requirements: Debian, root, FUSE, iproute2, util-linux. Installs
# glusterfs-server and glusterfs-client through apt when missing.
set -euo pipefail

# ---- configuration ---------------------------------------------------------------
STATE=${TIERKV_DFS_STATE:-/var/tmp/tierkv-dfs}   # everything of ours on disk
MNT=/mnt/tierkv-dfs                              # node mounts: $MNT/n1, $MNT/n2
VOL=tierkv
BR=tkvbr0
NET_PREFIX=10.213.47
SERVER=$NET_PREFIX.1                             # bridge address = brick host name
NODES=(n1 n2)
node_addr() { echo "$NET_PREFIX.1${1#n}"; }      # n1 -> .11, n2 -> .12
GLUSTERD_PORT=24007
# Directories of glusterd's that it (or its helpers) writes into even with its own
# working/run dirs; `up` records their contents, `down` removes anything new.
FOREIGN_DIRS=(/var/log/glusterfs /run/gluster /var/lib/glusterd)
FOREIGN_FILES=(/run/glusterd.socket /run/gluster.socket /run/glusterd.pid)
SOCK=$STATE/run/glusterd.socket
WAIT_S=${TIERKV_DFS_WAIT_S:-60}                  # bound on every wait below

T0=${EPOCHREALTIME/[.,]/}
# Progress goes to stderr, stamped with seconds since this invocation started.
log() {
    local now=${EPOCHREALTIME/[.,]/}
    printf 'dfs.sh: [%d.%02ds] %s\n' $(((now - T0) / 1000000)) $(((now - T0) / 10000 % 100)) "$*" >&2
}
die() { printf 'dfs.sh: error: %s\n' "$*" >&2; exit 1; }

# gluster CLI talking to our glusterd over our unix socket, never prompting.
g() {
    timeout 60 gluster --mode=script --glusterd-sock="$SOCK" \
        --log-file="$STATE/log/cli.log" "$@"
}

# Serialise up/down/status of concurrent callers without leaving a lock file:
# a shared lock is taken on this script itself.
lock() {
    # (Daemons started below get `9<&-` so they never inherit the lock.)
    exec 9<"${BASH_SOURCE[0]}"
    flock -w "$WAIT_S" 9 || die "another dfs.sh up/down is running (waited ${WAIT_S}s)"
}

# ---- small probes ---------------------------------------------------------------
pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }
glusterd_pid() {
    local p
    p=$(cat "$STATE/run/glusterd.pid" 2>/dev/null || true)
    if pid_alive "$p" && [[ $(cat "/proc/$p/comm" 2>/dev/null) == glusterd ]]; then
        echo "$p"
    fi
}
is_mounted() { findmnt -n -M "$1" -t fuse.glusterfs >/dev/null 2>&1; }
# A mount "answers" when a stat of its root returns within 5 s.
mount_answers() { is_mounted "$1" && timeout 5 stat -f "$1" >/dev/null 2>&1 \
                  && timeout 5 ls "$1" >/dev/null 2>&1; }
volume_started() { g volume info "$VOL" 2>/dev/null | grep -q '^Status: Started'; }
bricks_online() {   # number of our bricks whose status is 1 (online)
    g volume status "$VOL" --xml 2>/dev/null | awk -v b="$STATE/bricks/" '
        /<path>/ { p = index($0, b) > 0 }
        /<status>1<\/status>/ { if (p) n++ }
        END { print n + 0 }'
}

# Every gluster process this harness started, by pid: a gluster* process whose
# command line names our state dir, our mount dir or our server address.
our_gluster_pids() {
    local d p comm cmd
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        comm=$(cat "$d/comm" 2>/dev/null) || continue
        [[ $comm == gluster* ]] || continue
        cmd=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue
        case "$cmd" in
            *"$STATE"*|*"$MNT/"*|*"$SERVER:"*|*"=$SERVER "*|*"-s $SERVER "*) echo "$p" ;;
        esac
    done
}

# Kill pids: TERM, wait up to $2 seconds, then KILL; bounded.
kill_pids() {
    local pids=($1) t=${2:-5} i p
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < t * 10; i++)); do
        local left=()
        for p in "${pids[@]}"; do pid_alive "$p" && left+=("$p"); done
        ((${#left[@]})) || return 0
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
}

# ---- up --------------------------------------------------------------------------
ensure_packages() {
    command -v glusterd >/dev/null && command -v mount.glusterfs >/dev/null && return 0
    log "installing glusterfs-server glusterfs-client"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq glusterfs-server glusterfs-client >&2; then
        apt-get update -qq >&2
        apt-get install -y -qq glusterfs-server glusterfs-client >&2
    fi
    command -v glusterd >/dev/null || die "glusterd not found after install"
}

# Record what glusterd's fixed directories hold before we first start it.
record_foreign() {
    [[ -e $STATE/foreign.before ]] && return 0
    {
        local d f
        for d in "${FOREIGN_DIRS[@]}"; do
            if [[ -e $d ]]; then find "$d" -xdev 2>/dev/null; else echo "#absent $d"; fi
        done
        for f in "${FOREIGN_FILES[@]}"; do [[ -e $f ]] && echo "$f"; done
        [[ -d /run/netns ]] || echo "#absent /run/netns"
        [[ -d $MNT ]] || echo "#absent $MNT"
    } | sort >"$STATE/foreign.before.tmp"
    mv "$STATE/foreign.before.tmp" "$STATE/foreign.before"
}

ensure_network() {
    local n i addr
    if ! ip link show "$BR" >/dev/null 2>&1; then
        ip link add "$BR" type bridge
    fi
    ip addr replace "$SERVER/24" dev "$BR"
    ip link set "$BR" up
    for n in "${NODES[@]}"; do
        addr=$(node_addr "$n")
        if [[ ! -e /run/netns/tkv-$n ]]; then
            ip netns add "tkv-$n"
        fi
        if ! ip link show "tkv-${n}h" >/dev/null 2>&1; then
            ip link add "tkv-${n}h" type veth peer name tkv0 netns "tkv-$n"
        fi
        ip link set "tkv-${n}h" master "$BR" up
        ip -n "tkv-$n" link set lo up
        ip -n "tkv-$n" addr replace "$addr/24" dev tkv0
        ip -n "tkv-$n" link set tkv0 up
    done
    # Wait until each bridge port forwards (state 3; immediate without STP, but
    # bounded anyway). No ping is needed (and iputils may be absent).
    for n in "${NODES[@]}"; do
        for ((i = 0; ; i++)); do
            [[ $(cat "/sys/class/net/tkv-${n}h/brport/state" 2>/dev/null) == 3 ]] && break
            ((i < WAIT_S * 5)) || die "bridge port tkv-${n}h not forwarding"
            sleep 0.2
        done
    done
}

ensure_glusterd() {
    local i p
    [[ -n $(glusterd_pid) ]] && return 0
    # A glusterd we did not start owns port 24007: one glusterd per host.
    if ss -ltnH "sport = :$GLUSTERD_PORT" | grep -q .; then
        die "port $GLUSTERD_PORT is taken (another glusterd?); tools/dfs.sh needs it"
    fi
    mkdir -p "$STATE/lib" "$STATE/run" "$STATE/log" "$STATE/bricks"
    # glusterd needs the option groups; the stock hook scripts (samba, ctdb,
    # ganesha, selinux, geo-replication) would touch the host, so give it the
    # hook directory tree without the scripts.
    if [[ ! -d $STATE/lib/groups ]]; then
        cp -a /var/lib/glusterd/groups "$STATE/lib/groups" 2>/dev/null || mkdir -p "$STATE/lib/groups"
        (cd /var/lib/glusterd && find hooks -type d 2>/dev/null) | while read -r p; do
            mkdir -p "$STATE/lib/$p"
        done
    fi
    cat >"$STATE/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $STATE/lib
    option run-directory $STATE/run
    option logging-directory $STATE/log
    option glusterd-sockfile $SOCK
    option transport-type socket
    option transport.socket.bind-address $SERVER
    option transport.socket.listen-port $GLUSTERD_PORT
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option max-port 60999
end-volume
EOF
    log "starting glusterd"
    glusterd -f "$STATE/glusterd.vol" -p "$STATE/run/glusterd.pid" \
        -l "$STATE/log/glusterd.log" --log-level=WARNING 9<&-
    for ((i = 0; ; i++)); do
        [[ -S $SOCK ]] && g volume list >/dev/null 2>&1 && break
        ((i < WAIT_S * 5)) || die "glusterd not answering after ${WAIT_S}s (see $STATE/log/glusterd.log)"
        sleep 0.2
    done
}

ensure_volume() {
    local mode=$1 i
    if ! g volume info "$VOL" >/dev/null 2>&1; then
        log "creating volume $VOL ($mode)"
        mkdir -p "$STATE/bricks/b1" "$STATE/bricks/b2"
        g volume create "$VOL" replica 2 \
            "$SERVER:$STATE/bricks/b1" "$SERVER:$STATE/bricks/b2" force >&2
        if [[ $mode == coherent ]]; then
            g volume set "$VOL" performance.quick-read off >&2
            g volume set "$VOL" performance.stat-prefetch off >&2
            g volume set "$VOL" performance.open-behind off >&2
            g volume set "$VOL" performance.strict-o-direct on >&2
        fi
    fi
    if ! volume_started; then
        log "starting volume $VOL"
        g volume start "$VOL" >&2
    fi
    for ((i = 0; ; i++)); do
        [[ $(bricks_online) -ge 2 ]] && break
        ((i < WAIT_S * 5)) || die "bricks of $VOL not online after ${WAIT_S}s"
        sleep 0.2
    done
}

ensure_mounts() {
    local mode=$1 n m opts i
    mkdir -p "$MNT"
    # Make $MNT a shared mount point so that `exec` nodes (slave mount
    # namespaces) see later mounts and unmounts under it.
    if ! findmnt -n -M "$MNT" >/dev/null 2>&1; then
        mount --bind "$MNT" "$MNT"
        mount --make-shared "$MNT"
    fi
    for n in "${NODES[@]}"; do
        m=$MNT/$n
        mkdir -p "$m"
        if is_mounted "$m" && ! mount_answers "$m"; then
            log "$m is mounted but not answering; remounting"
            umount -l "$m" || true
        fi
        is_mounted "$m" && continue
        opts="log-file=$STATE/log/mnt-$n.log"
        [[ $mode == coherent ]] && opts="entry-timeout=0,attribute-timeout=0,$opts"
        log "mounting $SERVER:/$VOL on $m from netns tkv-$n ($opts)"
        nsenter --net="/run/netns/tkv-$n" \
            mount -t glusterfs -o "$opts" "$SERVER:/$VOL" "$m" >&2 9<&- \
            || die "mount of $m failed (see $STATE/log/mnt-$n.log)"
    done
    for n in "${NODES[@]}"; do
        for ((i = 0; ; i++)); do
            mount_answers "$MNT/$n" && break
            ((i < WAIT_S * 5)) || die "$MNT/$n not answering after ${WAIT_S}s"
            sleep 0.2
        done
    done
}

# ---- nodes ------------------------------------------------------------------------
# Each node is a long-lived init process (bash, which reaps the orphans it adopts) in its
# own network, UTS (host name tierkv-nN) and pid namespace, and a mount namespace that is a
# slave of the host's (it sees the FUSE mounts). `exec nN` enters those namespaces, so every
# command of one node sees the node's other processes' pids and the same host name: what
# tierkv's node id (host name, boot id, pid namespace) and its "is the owner of this temp
# file alive" check rely on. `down` kills the inits, and with them every node process.
node_init_pid() {   # the host pid of node $1's init, if it runs
    local f=$STATE/node-$1.pid p c
    [[ -e $f ]] || return 0
    p=$(cat "$f")
    pid_alive "$p" || return 0
    # The unshare process's child is the init (pid 1 of the node).
    c=$(cat "/proc/$p/task/$p/children" 2>/dev/null | awk '{print $1}')
    [[ -n $c ]] && pid_alive "$c" && echo "$c"
    return 0
}

ensure_nodes() {
    local n i
    for n in "${NODES[@]}"; do
        [[ -n $(node_init_pid "$n") ]] && continue
        log "starting node $n (netns tkv-$n, host name tierkv-$n, its own pid namespace)"
        setsid nsenter --net="/run/netns/tkv-$n" \
            unshare --uts --pid --fork --kill-child=SIGKILL --mount-proc --propagation slave \
            bash -c 'hostname "$0" || exit 125; trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done' \
            "tierkv-$n" </dev/null >/dev/null 2>&1 9<&- &
        echo $! >"$STATE/node-$n.pid"
        for ((i = 0; ; i++)); do
            [[ -n $(node_init_pid "$n") ]] && break
            ((i < 50)) || die "node $n did not start"
            sleep 0.1
        done
    done
}

stop_nodes() {
    local n p
    for n in "${NODES[@]}"; do
        [[ -e $STATE/node-$n.pid ]] || continue
        p=$(cat "$STATE/node-$n.pid")
        # unshare --kill-child: its death SIGKILLs the init, and so the whole pid namespace.
        pid_alive "$p" && kill_pids "$p" 5
        rm -f "$STATE/node-$n.pid"
    done
}

cmd_up() {
    local mode=${TIERKV_DFS_MODE:-coherent} n
    while (($#)); do
        case $1 in
            --defaults) mode=defaults ;;
            --coherent) mode=coherent ;;
            *) die "up: unknown option $1" ;;
        esac
        shift
    done
    [[ $mode == coherent || $mode == defaults ]] || die "mode must be coherent or defaults"
    ((EUID == 0)) || die "must run as root"
    lock
    if [[ -e $STATE/mode && $(cat "$STATE/mode") != "$mode" ]]; then
        die "cluster is set up in $(cat "$STATE/mode") mode; run 'tools/dfs.sh down' first to switch to $mode"
    fi
    [[ -e /dev/fuse ]] || modprobe fuse 2>/dev/null || true
    [[ -e /dev/fuse ]] || die "/dev/fuse missing"
    ensure_packages
    mkdir -p "$STATE"
    touch "$STATE/.tierkv-dfs"          # marker: `down` removes only a dir with it
    record_foreign
    echo "$mode" >"$STATE/mode"
    ensure_network
    ensure_glusterd
    ensure_volume "$mode"
    ensure_mounts "$mode"
    ensure_nodes
    log "up ($mode)"
    for n in "${NODES[@]}"; do echo "$n $MNT/$n"; done
}

# ---- down ------------------------------------------------------------------------
cmd_down() {
    local n m i pids f d
    ((EUID == 0)) || die "must run as root"
    lock
    # 0. The nodes, and every process running on them.
    stop_nodes
    # 1. FUSE mounts (lazy unmount when busy), then the shared bind mount.
    for n in "${NODES[@]}"; do
        m=$MNT/$n
        for ((i = 0; i < 5 && $(findmnt -n -M "$m" 2>/dev/null | wc -l) > 0; i++)); do
            timeout 10 umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        done
    done
    for ((i = 0; i < 5 && $(findmnt -n -M "$MNT" 2>/dev/null | wc -l) > 0; i++)); do
        umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    done
    # 2. Stop the volume (its bricks and self-heal daemon), then glusterd.
    if [[ -n $(glusterd_pid) ]]; then
        log "stopping volume $VOL"
        g volume stop "$VOL" force >/dev/null 2>&1 || true
        log "stopping glusterd"
        kill_pids "$(glusterd_pid)" 5
    fi
    # 3. Any gluster process of ours still alive (FUSE clients of lazily unmounted
    #    mounts, bricks of a glusterd that died).
    pids=$(our_gluster_pids | tr '\n' ' ')
    [[ -n ${pids// /} ]] && { log "killing leftover gluster processes: $pids"; kill_pids "$pids" 5; }
    log "removing namespaces, veths, bridge, files"
    # 4. Network: deleting a namespace deletes its veth end and so the pair.
    for n in "${NODES[@]}"; do
        ip netns del "tkv-$n" 2>/dev/null || true
        ip link del "tkv-${n}h" 2>/dev/null || true
    done
    ip link del "$BR" 2>/dev/null || true
    # 5. Files outside the state dir: anything new in glusterd's fixed dirs, and
    #    the dirs `ip netns` and `up` created when they did not exist before.
    if [[ -e $STATE/foreign.before ]]; then
        for d in "${FOREIGN_DIRS[@]}"; do
            [[ -e $d ]] || continue
            find "$d" -xdev -depth 2>/dev/null | while read -r f; do
                grep -qxF -- "$f" "$STATE/foreign.before" && continue
                if [[ -d $f && ! -L $f ]]; then rmdir -- "$f" 2>/dev/null || true; else rm -f -- "$f"; fi
            done
            if grep -qxF "#absent $d" "$STATE/foreign.before"; then rmdir -- "$d" 2>/dev/null || true; fi
        done
        for f in "${FOREIGN_FILES[@]}"; do
            [[ -e $f ]] && ! grep -qxF -- "$f" "$STATE/foreign.before" && rm -f -- "$f"
        done
        if grep -qxF "#absent /run/netns" "$STATE/foreign.before" && [[ -d /run/netns ]] \
            && [[ -z $(ls -A /run/netns) ]]; then
            umount /run/netns 2>/dev/null || true
            rmdir /run/netns 2>/dev/null || true
        fi
    fi
    for n in "${NODES[@]}"; do rmdir "$MNT/$n" 2>/dev/null || true; done
    rmdir "$MNT" 2>/dev/null || true
    # 6. The state dir itself (only when it carries our marker).
    if [[ -e $STATE/.tierkv-dfs ]]; then
        rm -rf --one-file-system -- "$STATE"
    elif [[ -e $STATE ]]; then
        log "warning: $STATE has no .tierkv-dfs marker; left in place"
    fi
    log "down"
    # Report anything left (never fails: `down` is idempotent).
    for n in "${NODES[@]}"; do
        [[ -e /run/netns/tkv-$n ]] && log "warning: netns tkv-$n still present"
        findmnt -n -M "$MNT/$n" >/dev/null 2>&1 && log "warning: $MNT/$n still mounted"
    done
    pids=$(our_gluster_pids | tr '\n' ' ')
    [[ -n ${pids// /} ]] && log "warning: gluster processes still alive: $pids"
    return 0
}

# ---- status ----------------------------------------------------------------------
cmd_status() {
    local n up=1 p
    p=$(glusterd_pid)
    if [[ -z $p ]]; then up=0; fi
    for n in "${NODES[@]}"; do mount_answers "$MNT/$n" || up=0; done
    if ((up)); then
        echo "up ($(cat "$STATE/mode" 2>/dev/null || echo '?') mode, glusterd pid $p, state $STATE)"
        for n in "${NODES[@]}"; do echo "$n $MNT/$n"; done
        g volume info "$VOL" || true
        g volume status "$VOL" || true
        return 0
    fi
    echo "down"
    [[ -n $p ]] && echo "  glusterd running (pid $p)"
    for n in "${NODES[@]}"; do
        [[ -e /run/netns/tkv-$n ]] && echo "  netns tkv-$n present"
        is_mounted "$MNT/$n" && echo "  $MNT/$n mounted but not answering"
    done
    [[ -e $STATE ]] && echo "  state dir $STATE present"
    return 1
}

# ---- exec ------------------------------------------------------------------------
# Node init (pid 1 of the node's PID namespace): set the hostname, run CMD as a
# child (so CMD never is pid 1, which ignores default-action signals and would
# make "is pid X alive" checks meaningless), forward TERM/INT/HUP to it, exit
# with its status.
cmd_exec() {
    (($# >= 2)) || die "usage: dfs.sh exec nN CMD [ARGS...]"
    local n=$1 init; shift
    [[ " ${NODES[*]} " == *" $n "* ]] || die "unknown node $n (have: ${NODES[*]})"
    init=$(node_init_pid "$n")
    [[ -n $init ]] || die "node $n is not running: run 'tools/dfs.sh up' first"
    # Into the node's namespaces (nsenter forks into its pid namespace). setpriv
    # --pdeathsig KILL twice: SIGKILL to this script kills nsenter, and that kills the
    # command: a SIGKILLed `exec` is a crash of the command on its node. The working
    # directory and the environment pass through; so does the exit status.
    exec setpriv --pdeathsig KILL \
        nsenter --target "$init" --net --uts --pid --mount --wdns="$PWD" \
        setpriv --pdeathsig KILL "$@"
}

case ${1:-} in
    up) shift; cmd_up "$@" ;;
    down) shift; cmd_down ;;
    status) shift; cmd_status ;;
    exec) shift; cmd_exec "$@" ;;
    *) echo "usage: $0 up [--coherent|--defaults] | down | status | exec nN CMD [ARGS...]" >&2; exit 2 ;;
esac
