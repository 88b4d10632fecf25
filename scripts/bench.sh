#!/usr/bin/env bash
# sbx against the docker CLI and raw Engine API calls (curl --unix-socket) on
# this machine, in one run. Prints the machine, then a markdown table of
# medians, then notes (the numbers behind the table, anomalies).
#
# Usage: scripts/bench.sh [--build] [-n N] [--quick]
#   --build     run `make` first (default: only when build/sbx is missing)
#   -n N        samples for the sequential measures (default 10)
#   --quick     N=5, 1 concurrent round, 1 run per big output, no 1 GB for CLI/raw
# Env:
#   BENCH_N          samples for create+destroy and exec latency (default 10)
#   BENCH_ROUNDS     rounds of the 16 boxes x 20 execs test (default 1: one
#                    round is 320 execs per client and ~75 s in all)
#   BENCH_BOXES / BENCH_EXECS   shape of the concurrent test (16 / 20)
#   BENCH_BIG_RUNS   runs of the 50 MB output per client (default 3)
#   BENCH_1G_RUNS    runs of the 1 GB output through sbx (default 1)
#   BENCH_1G_ALL     1: also 1 GB through the docker CLI and curl (default 0; ~30 s more)
#   BENCH_IDLE       idle boxes for the memory-per-box measure (default 50)
#   BENCH_IMAGE      image (default sbx-busybox:latest)
#   SBX              the sbx binary (default build/sbx)
#   DOCKER_HOST      unix:///path (default unix:///var/run/docker.sock)
#
# Every container it makes is named sbx-bench-* and labelled
# sbx-bench=<run id>; they are removed at the end, on error and on Ctrl-C.
# The CLI and raw-API containers get the same settings sbx gives its boxes
# (init, network none, 1 GiB memory without swap, 1 CPU, 512 pids, the
# dropped capabilities, no-new-privileges), so all three ask the daemon for
# the same work. Progress goes to stderr; the report to stdout.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

N=${BENCH_N:-10}
ROUNDS=${BENCH_ROUNDS:-1}
BOXES=${BENCH_BOXES:-16}
EXECS=${BENCH_EXECS:-20}
BIG_RUNS=${BENCH_BIG_RUNS:-3}
G_RUNS=${BENCH_1G_RUNS:-1}
G_ALL=${BENCH_1G_ALL:-0}
IDLE=${BENCH_IDLE:-50}
IMAGE=${BENCH_IMAGE:-sbx-busybox:latest}
SBX=${SBX:-build/sbx}
build=0

while [ $# -gt 0 ]; do
    case "$1" in
        --build) build=1 ;;
        -n) N=$2; shift ;;
        --quick) N=5; ROUNDS=1; BIG_RUNS=1; G_ALL=0 ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

MB50=52428800
GB1=1073741824

log() { printf 'bench: %s\n' "$*" >&2; }
# section NAME: logs NAME and the time the previous section took.
SECTION="" SECTION_T0=0 SECTION_TIMES=""
section() {
    local now=${EPOCHREALTIME/./}
    if [ -n "$SECTION" ]; then
        SECTION_TIMES+="${SECTION_TIMES:+, }$SECTION $(( (now - SECTION_T0) / 1000000 )) s"
        log "   ($(( (now - SECTION_T0) / 1000000 )) s)"
    fi
    SECTION=$1 SECTION_T0=$now
    [ "$1" = end ] || log "$2"
}
die() { printf 'bench: error: %s\n' "$*" >&2; exit 1; }

# --- tools --------------------------------------------------------------------
need_pkgs=()
[ -x /usr/bin/time ] || need_pkgs+=(time)
command -v curl >/dev/null || need_pkgs+=(curl)
command -v make >/dev/null || need_pkgs+=(make)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "missing ${need_pkgs[*]}; install them or run as root"
    log "installing ${need_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
command -v docker >/dev/null || die "the docker CLI is not installed (scripts/setup.sh installs docker.io)"

if [ "$build" -eq 1 ] || [ ! -x "$SBX" ]; then
    log "building sbx"
    make -s >&2 || die "make failed"
fi
[ -x "$SBX" ] || die "$SBX is not executable"

case "${DOCKER_HOST:-}" in
    "") SOCK=/var/run/docker.sock ;;
    unix://*) SOCK=${DOCKER_HOST#unix://} ;;
    *) die "the raw-API column needs a unix socket; DOCKER_HOST=$DOCKER_HOST" ;;
esac
[ -S "$SOCK" ] || die "no Docker socket at $SOCK"

API=$(curl -sS --unix-socket "$SOCK" -o /dev/null -D - http://docker/_ping | tr -d '\r' |
      awk -F': ' 'tolower($1)=="api-version"{print $2}')
[ -n "$API" ] || die "the daemon at $SOCK did not answer /_ping"
BASE="http://docker/v$API"
curl -sf --unix-socket "$SOCK" -o /dev/null "$BASE/images/$IMAGE/json" ||
    die "image $IMAGE is not on the daemon (scripts/setup.sh builds it)"

# --- cleanup --------------------------------------------------------------------
RUN_ID="$$-$(date +%s)"
export BENCH_RUN_ID=$RUN_ID BENCH_IMAGE=$IMAGE
TMP=$(mktemp -d /tmp/sbx-bench.XXXXXX)
bg_pids=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local p
    for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    local ids
    ids=$(docker ps -aq --filter "label=sbx-bench=$RUN_ID" 2>/dev/null || true)
    if [ -n "$ids" ]; then
        log "removing $(echo "$ids" | wc -l) bench container(s)"
        # shellcheck disable=SC2086
        docker rm -f $ids >/dev/null 2>&1 || true
    fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# --- helpers ----------------------------------------------------------------------
# Samples live in $TMP/<key>, one number a line.
sample() { echo "$2" >> "$TMP/$1"; }
median() {
    [ -s "$TMP/$1" ] || { echo ""; return; }
    sort -g "$TMP/$1" | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2 }'
}
maxof() { [ -s "$TMP/$1" ] || { echo ""; return; }; sort -g "$TMP/$1" | tail -1; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", (b-a)/1e6}'; }
fmt() { # fmt VALUE SCALE DECIMALS SUFFIX  -> "" stays "n/a"
    [ -n "$1" ] || { echo "n/a"; return; }
    awk -v v="$1" -v s="$2" -v d="$3" -v u="$4" 'BEGIN{printf "%.*f%s", d, v*s, u}'
}

# Runs a Lua bench script; its "key value" lines become samples.
run_lua() {
    local name=$1; shift
    local rc=0
    "$SBX" run "$here/bench/$name.lua" "$@" > "$TMP/lua.out" || rc=$?
    [ "$rc" -lt 128 ] || exit "$rc"     # interrupted: sbx removed its boxes
    [ "$rc" -eq 0 ] || die "$name.lua failed (see above)"
    local k v
    while read -r k v; do sample "$k" "$v"; done < "$TMP/lua.out"
}

# The settings sbx's default policy gives a box, for the CLI and curl.
CLI_OPTS=(--init --network none --memory 1g --memory-swap 1g --cpus 1 --pids-limit 512
          --cap-drop NET_RAW --cap-drop MKNOD --cap-drop AUDIT_WRITE --cap-drop SETFCAP
          --cap-drop SYS_CHROOT --security-opt no-new-privileges --stop-signal SIGKILL
          -w /work --label "sbx-bench=$RUN_ID")
CREATE_BODY=$(cat <<EOF
{"Image":"$IMAGE","Entrypoint":["sleep"],"Cmd":["infinity"],"WorkingDir":"/work",
 "Labels":{"sbx-bench":"$RUN_ID"},"Tty":false,"OpenStdin":false,"StopSignal":"SIGKILL",
 "HostConfig":{"Init":true,"NetworkMode":"none","Memory":1073741824,"MemorySwap":1073741824,
  "NanoCpus":1000000000,"PidsLimit":512,"SecurityOpt":["no-new-privileges"],
  "CapDrop":["NET_RAW","MKNOD","AUDIT_WRITE","SETFCAP","SYS_CHROOT"],"CapAdd":[],"ReadonlyRootfs":false}}
EOF
)

cli_create() { docker run -d "${CLI_OPTS[@]}" --name "$1" "$IMAGE" sleep infinity >/dev/null; }
cli_destroy() { docker rm -f "$1" >/dev/null; }

# raw_create NAME: create + start (2 calls). raw_destroy NAME: 1 call.
raw_create() {
    local out code
    out=$(curl -sS --unix-socket "$SOCK" -H 'Content-Type: application/json' -d "$CREATE_BODY" \
          "$BASE/containers/create?name=$1")
    [[ $out =~ \"Id\":\"([0-9a-f]+)\" ]] || { echo "raw create: $out" >&2; return 1; }
    code=$(curl -sS --unix-socket "$SOCK" -X POST -o /dev/null -w '%{http_code}' "$BASE/containers/$1/start")
    [ "$code" = 204 ] || { echo "raw start: HTTP $code" >&2; return 1; }
}
raw_destroy() {
    local code
    code=$(curl -sS --unix-socket "$SOCK" -X DELETE -o /dev/null -w '%{http_code}' \
           "$BASE/containers/$1?force=true&v=true")
    [ "$code" = 204 ] || { echo "raw delete: HTTP $code" >&2; return 1; }
}
# raw_exec CONTAINER CMD_JSON [TIME_FILE]: exec create, attached start (the
# multiplexed stream goes to /dev/null), exec inspect: 3 calls. Fails unless
# the command ended with exit code 0. With TIME_FILE, the start call runs
# under /usr/bin/time (elapsed s, peak RSS KB) and the byte count of the
# stream is appended to TIME_FILE.bytes.
raw_exec() {
    local out eid j
    out=$(curl -sS --unix-socket "$SOCK" -H 'Content-Type: application/json' \
          -d "{\"AttachStdout\":true,\"AttachStderr\":true,\"Tty\":false,\"Cmd\":$2}" \
          "$BASE/containers/$1/exec")
    [[ $out =~ \"Id\":\"([0-9a-f]+)\" ]] || { echo "raw exec create: $out" >&2; return 1; }
    eid=${BASH_REMATCH[1]}
    if [ -n "${3:-}" ]; then
        /usr/bin/time -f '%e %M' -a -o "$3" curl -sS --unix-socket "$SOCK" -H 'Content-Type: application/json' \
            -d '{"Detach":false,"Tty":false}' -o /dev/null -w '%{size_download}\n' \
            "$BASE/exec/$eid/start" >> "$3.bytes"
    else
        curl -sS --unix-socket "$SOCK" -H 'Content-Type: application/json' \
            -d '{"Detach":false,"Tty":false}' -o /dev/null "$BASE/exec/$eid/start"
    fi
    j=$(curl -sS --unix-socket "$SOCK" "$BASE/exec/$eid/json")
    [[ $j =~ \"Running\":false ]] && [[ $j =~ \"ExitCode\":0[,}] ]] || { echo "raw exec: $j" >&2; return 1; }
}

# --- machine --------------------------------------------------------------------------
others_before=$(docker ps -aq | wc -l)
T_START=${EPOCHREALTIME/./}
server=$(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})' 2>/dev/null || echo unknown)
client=$(docker version --format '{{.Client.Version}}' 2>/dev/null || echo unknown)
echo "# sbx benchmark"
echo
echo "- machine: $(nproc) CPUs ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo) RAM, Linux $(uname -r)"
echo "- dockerd $server at $SOCK; docker CLI $client; curl $(curl --version | awk 'NR==1{print $2}')"
echo "- sbx: $("$SBX" --version 2>/dev/null), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$( [ -n "$(git status --porcelain -- src lua 2>/dev/null)" ] && echo ' + uncommitted changes in src/ lua/')"
echo "- image $IMAGE; N=$N samples, $ROUNDS round(s) of ${BOXES}x${EXECS} concurrent execs, $BIG_RUNS run(s) of 50 MB, $G_RUNS of 1 GB; load average at start: $(cut -d' ' -f1-3 /proc/loadavg); containers already on the daemon: $others_before"
echo

# --- 1. create + destroy -------------------------------------------------------------
section create "1/5 box create+destroy, $N samples each"
run_lua create "$N"
cli_create "sbx-bench-$RUN_ID-w" && cli_destroy "sbx-bench-$RUN_ID-w"
for i in $(seq "$N"); do
    c="sbx-bench-$RUN_ID-cli$i"
    t0=${EPOCHREALTIME/./}; cli_create "$c"; t1=${EPOCHREALTIME/./}; cli_destroy "$c"; t2=${EPOCHREALTIME/./}
    sample cli_create_destroy "$(secs "$t0" "$t2")"; sample cli_create "$(secs "$t0" "$t1")"
done
for i in $(seq "$N"); do
    c="sbx-bench-$RUN_ID-raw$i"
    t0=${EPOCHREALTIME/./}; raw_create "$c"; t1=${EPOCHREALTIME/./}; raw_destroy "$c"; t2=${EPOCHREALTIME/./}
    sample raw_create_destroy "$(secs "$t0" "$t2")"; sample raw_create "$(secs "$t0" "$t1")"
done

# --- 2. exec latency ------------------------------------------------------------------
section exec "2/5 sequential exec of true, $N samples each"
run_lua exec "$N"
X="sbx-bench-$RUN_ID-x"
raw_create "$X"
for _ in 1 2; do docker exec "$X" true; raw_exec "$X" '["true"]'; done
for _ in $(seq "$N"); do
    t0=${EPOCHREALTIME/./}; docker exec "$X" true; t1=${EPOCHREALTIME/./}
    sample cli_exec "$(secs "$t0" "$t1")"
done
for _ in $(seq "$N"); do
    t0=${EPOCHREALTIME/./}; raw_exec "$X" '["true"]'; t1=${EPOCHREALTIME/./}
    sample raw_exec "$(secs "$t0" "$t1")"
done

# --- 3. concurrent execs --------------------------------------------------------------
section concurrent "3/5 $BOXES boxes x $EXECS execs concurrently, $ROUNDS round(s) each"
run_lua concurrent "$BOXES" "$EXECS" "$ROUNDS"
cons=()
for i in $(seq "$BOXES"); do
    cons+=("sbx-bench-$RUN_ID-c$i")
    raw_create "sbx-bench-$RUN_ID-c$i" & bg_pids+=($!)
done
wait; bg_pids=()
# conc_loops KIND: one loop per box, each running EXECS execs in a row.
conc_loops() {
    local kind=$1 c t0 t1 fails
    : > "$TMP/fail.$kind"
    t0=${EPOCHREALTIME/./}
    for c in "${cons[@]}"; do
        (
            for _ in $(seq "$EXECS"); do
                if [ "$kind" = cli ]; then docker exec "$c" true || echo x >> "$TMP/fail.$kind"
                else raw_exec "$c" '["true"]' || echo x >> "$TMP/fail.$kind"; fi
            done
        ) & bg_pids+=($!)
    done
    wait; bg_pids=()
    t1=${EPOCHREALTIME/./}
    fails=$(wc -l < "$TMP/fail.$kind")
    sample "${kind}_conc_rate" "$(awk -v n=$((BOXES * EXECS)) -v s="$(secs "$t0" "$t1")" 'BEGIN{print n/s}')"
    sample "${kind}_conc_failures" "$fails"
}
for _ in $(seq "$ROUNDS"); do conc_loops raw; conc_loops cli; done
for c in "${cons[@]}"; do raw_destroy "$c" & bg_pids+=($!); done
wait; bg_pids=()

# --- 4. big outputs ---------------------------------------------------------------------
section output "4/5 big outputs: 50 MB x $BIG_RUNS per client, 1 GB x $G_RUNS through sbx"
# sbx: one process per size, peak RSS of the whole process from /usr/bin/time.
sbx_out() { # sbx_out PREFIX BYTES RUNS
    : > "$TMP/time.out"
    local rc=0
    /usr/bin/time -f '%e %M' -o "$TMP/time.out" "$SBX" run "$here/bench/output.lua" "$2" "$3" > "$TMP/lua.out" || rc=$?
    [ "$rc" -lt 128 ] || exit "$rc"
    [ "$rc" -eq 0 ] || die "output.lua $2 failed (see above)"
    local k v
    while read -r k v; do sample "$1_$k" "$v"; done < "$TMP/lua.out"
    sample "$1_peak_kb" "$(awk '{print $2}' "$TMP/time.out")"
}
sbx_out base 0 1
sbx_out m50 "$MB50" "$BIG_RUNS"
sbx_out g1 "$GB1" "$G_RUNS"
cli_out() { # cli_out PREFIX BYTES RUNS
    local i
    for i in $(seq "$3"); do
        /usr/bin/time -f '%e %M' -o "$TMP/time.out" docker exec "$X" sh -c "head -c $2 /dev/zero" > /dev/null
        sample "$1_time" "$(awk '{print $1}' "$TMP/time.out")"
        sample "$1_peak_kb" "$(awk '{print $2}' "$TMP/time.out")"
    done
}
raw_out() {
    local i t0 t1
    for i in $(seq "$3"); do
        : > "$TMP/time.out"; : > "$TMP/time.out.bytes"
        t0=${EPOCHREALTIME/./}; raw_exec "$X" "[\"sh\",\"-c\",\"head -c $2 /dev/zero\"]" "$TMP/time.out"; t1=${EPOCHREALTIME/./}
        sample "$1_time" "$(secs "$t0" "$t1")"
        sample "$1_peak_kb" "$(awk '{print $2}' "$TMP/time.out")"
        sample "$1_stream_bytes" "$(cat "$TMP/time.out.bytes")"
    done
}
cli_out cli_m50 "$MB50" "$BIG_RUNS"
raw_out raw_m50 "$MB50" "$BIG_RUNS"
if [ "$G_ALL" = 1 ]; then
    log "   1 GB through the docker CLI and curl (BENCH_1G_ALL=0 skips)"
    cli_out cli_g1 "$GB1" 1
    raw_out raw_g1 "$GB1" 1
fi
raw_destroy "$X"

# --- 5. idle boxes ------------------------------------------------------------------------
section idle "5/5 host memory: 0 vs $IDLE idle boxes"
run_lua idle "$IDLE" 8

section end
T_END=${EPOCHREALTIME/./}
others_after=$(docker ps -aq | wc -l)
leftover=$(docker ps -aq --filter "label=sbx-bench=$RUN_ID" | wc -l)

# --- report -------------------------------------------------------------------------------
verdict() { # verdict VALUE OP LIMIT -> ok / MISS / n/a
    [ -n "$1" ] || { echo "n/a"; return; }
    awk -v v="$1" -v l="$3" -v op="$2" 'BEGIN{ ok = (op=="<=" ? v<=l : op=="<" ? v<l : op==">=" ? v>=l : 0); print ok ? "ok" : "MISS" }'
}
cd_sbx=$(median create_destroy)
ex_sbx=$(median exec_argv)
rate_sbx=$(median conc_rate)
m50_peak=$(maxof m50_peak_kb)
g1_peak=$(maxof g1_peak_kb)
idle_kb=$(median idle_per_box_kb)
flat_delta=$(awk -v a="$g1_peak" -v b="$m50_peak" 'BEGIN{ if (a=="" || b=="") print ""; else print a-b }')
flat=$( [ -n "$flat_delta" ] && awk -v d="$flat_delta" 'BEGIN{print (d <= 2048) ? "ok" : "MISS"}' || echo n/a)
g1_cli=$( [ "$G_ALL" = 1 ] && echo "$(fmt "$(median cli_g1_time)" 1 2 ' s') / $(fmt "$(maxof cli_g1_peak_kb)" 0.0009765625 1 ' MB')" || echo "not run (BENCH_1G_ALL=1)")
g1_raw=$( [ "$G_ALL" = 1 ] && echo "$(fmt "$(median raw_g1_time)" 1 2 ' s') / $(fmt "$(maxof raw_g1_peak_kb)" 0.0009765625 1 ' MB')" || echo "not run (BENCH_1G_ALL=1)")

echo "| measure | sbx | docker CLI | raw API | target |"
echo "|---|---|---|---|---|"
echo "| box create+destroy (median s) | $(fmt "$cd_sbx" 1 3 ' s') | $(fmt "$(median cli_create_destroy)" 1 3 ' s') | $(fmt "$(median raw_create_destroy)" 1 3 ' s') | <= 0.35 s: $(verdict "$cd_sbx" '<=' 0.35) |"
echo "| exec \`true\`, sequential (median ms) | $(fmt "$ex_sbx" 1000 1 ' ms') | $(fmt "$(median cli_exec)" 1000 1 ' ms') | $(fmt "$(median raw_exec)" 1000 1 ' ms') | <= 50 ms: $(verdict "$ex_sbx" '<=' 0.050) |"
echo "| ${BOXES} boxes x ${EXECS} execs concurrently (execs/s) | $(fmt "$rate_sbx" 1 1 '') | $(fmt "$(median cli_conc_rate)" 1 1 '') | $(fmt "$(median raw_conc_rate)" 1 1 '') | >= 37/s: $(verdict "$rate_sbx" '>=' 37) |"
echo "| 50 MB output: wall time (median s) | $(fmt "$(median m50_out_time)" 1 2 ' s') | $(fmt "$(median cli_m50_time)" 1 2 ' s') | $(fmt "$(median raw_m50_time)" 1 2 ' s') | - |"
echo "| 50 MB output: peak RSS of the client | $(fmt "$m50_peak" 0.0009765625 1 ' MB') | $(fmt "$(maxof cli_m50_peak_kb)" 0.0009765625 1 ' MB') | $(fmt "$(maxof raw_m50_peak_kb)" 0.0009765625 1 ' MB') | < 16 MB: $(verdict "$m50_peak" '<' 16384) |"
echo "| 1 GB output: wall time / peak RSS | $(fmt "$(median g1_out_time)" 1 2 ' s') / $(fmt "$g1_peak" 0.0009765625 1 ' MB') | $g1_cli | $g1_raw | flat (<= 50 MB peak + 2 MB): $flat |"
echo "| host memory per idle box (KB) | $(fmt "$idle_kb" 1 1 ' KB') | - | - | < 16 KB: $(verdict "$idle_kb" '<' 16) |"
echo
echo "Notes:"
echo "- total bench time $(fmt "$(secs "$T_START" "$T_END")" 1 0 ' s') ($SECTION_TIMES); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
echo "- sbx times are taken inside Lua with sbx.now(); docker CLI and raw API times in bash around the commands (curl and docker process start-up included: that is their real cost)."
echo "- create+destroy split (median): sbx $(fmt "$(median create)" 1 3 ' s') + $(fmt "$(median destroy)" 1 3 ' s'); docker CLI run $(fmt "$(median cli_create)" 1 3 ' s'); raw create+start $(fmt "$(median raw_create)" 1 3 ' s') (2 calls, then 1 DELETE)."
echo "- exec as a shell string (\`box:exec(\"true\")\`, through the policy's sh wrapper): $(fmt "$(median exec_string)" 1000 1 ' ms'); the table uses the argv form \`{\"true\"}\`, the same work as \`docker exec C true\`. Raw API = exec create + attached start + exec inspect."
echo "- concurrent: failures sbx $(fmt "$(maxof conc_failures)" 1 0 ""), docker CLI $(maxof cli_conc_failures), raw $(maxof raw_conc_failures) (max per round); sbx setup of $BOXES boxes $(fmt "$(median conc_setup_s)" 1 2 ' s'), teardown $(fmt "$(median conc_teardown_s)" 1 2 ' s'); sbx RSS after each round: $(tr '\n' ' ' < "$TMP/conc_rss_kb" | awk '{for(i=1;i<=NF;i++) printf "%d%s", $i, (i<NF?", ":"")}') KB."
echo "- sbx RSS growth over $N sequential execs: $(fmt "$(median exec_rss_growth_kb)" 1 0 ' KB')."
echo "- sbx peak RSS with a single \`true\` exec (baseline): $(fmt "$(maxof base_peak_kb)" 0.0009765625 1 ' MB'); with 50 MB: $(fmt "$m50_peak" 0.0009765625 1 ' MB'); with 1 GB: $(fmt "$g1_peak" 0.0009765625 1 ' MB') (delta vs 50 MB: $(fmt "$flat_delta" 1 0 ' KB')); VmHWM read inside Lua: $(fmt "$(maxof m50_out_hwm_kb)" 0.0009765625 1 ' MB') / $(fmt "$(maxof g1_out_hwm_kb)" 0.0009765625 1 ' MB'). Bytes kept per result (stdout + output captures): $(fmt "$(maxof m50_out_kept_bytes)" 1 0 ''). Throughput 1 GB: sbx $(awk -v t="$(median g1_out_time)" 'BEGIN{ if (t>0) printf "%.0f MB/s", 1024/t; else print "n/a" }')."
echo "- raw API 50 MB stream bytes (8-byte frame headers included): $(maxof raw_m50_stream_bytes)."
echo "- idle boxes: VmRSS $(fmt "$(median idle_rss0_kb)" 1 0 ' KB') with 0 boxes, $(fmt "$(median idle_rss1_kb)" 1 0 ' KB') with $IDLE, $(fmt "$(median idle_rss_after_close_kb)" 1 0 ' KB') after closing them; Lua heap $(fmt "$(median idle_heap_per_box_kb)" 1 2 ' KB') per box, $(fmt "$(median idle_heap_after_close_kb)" 1 1 ' KB') left after closing all."
echo "- other containers on the daemon: $others_before at start, $others_after at the end (someone else's load skews the numbers); bench containers left before cleanup: $leftover."
