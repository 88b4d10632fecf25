# Steps of the setup scripts (scripts/setup.sh, scripts/build-images.sh),
# sourced by both: log and die say what happens, busy runs a long step and
# says it is still running.
log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }
# busy WHAT [OUT] -- CMD...: runs CMD (its stdout and stderr to the file OUT
# when given), saying every $SBX_SETUP_HEARTBEAT seconds (default 30) that
# it still is WHAT, how long so far, and OUT's last line (what the command
# itself last said), so a step that takes minutes is never silent. CMD's
# status is busy's.
busy() {
    local what=$1 logf='' pid rc t0=$SECONDS n=0 every=${SBX_SETUP_HEARTBEAT:-30}
    shift
    if [ "$1" != -- ]; then logf=$1; shift; fi
    shift
    if [ -n "$logf" ]; then "$@" >"$logf" 2>&1 & else "$@" & fi
    pid=$!
    # A background command of a script ignores SIGINT: pass it on.
    trap 'kill "$pid" 2>/dev/null; exit 130' INT TERM
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        n=$((n + 1))
        if [ $((n % every)) -eq 0 ] && kill -0 "$pid" 2>/dev/null; then
            local last=
            [ -f "$logf" ] && [ -s "$logf" ] && last=$(tail -n 1 "$logf" | cut -c1-100)
            log "still $what ($((SECONDS - t0))s)${last:+: $last}"
        fi
    done
    wait "$pid" && rc=0 || rc=$?
    trap - INT TERM
    return "$rc"
}
