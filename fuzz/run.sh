#!/usr/bin/env bash
# Runs the libFuzzer targets that `make fuzz` built, one after the other.
#   fuzz/run.sh BUILD SECONDS NAME...          fuzz each for SECONDS
#   fuzz/run.sh --merge BUILD 0 NAME...         minimise into the corpus
# A run reads fuzz/corpus/NAME and never writes it: new inputs go to
# BUILD/new/NAME, a finding to BUILD/crashes/NAME-*, the log to
# BUILD/log/NAME.log. Every target runs even after a finding; the exit
# status is 1 if any had one. --merge rebuilds fuzz/corpus/NAME from the
# named inputs kept by hand (seed-*, regress-*) plus whatever else, from the
# corpus and BUILD/new/NAME, adds coverage to them.
set -u
cd "$(dirname "$0")/.."
merge=0
if [ "${1:-}" = --merge ]; then
  merge=1
  shift
fi
build=$1 seconds=$2
shift 2
mkdir -p "$build/log" "$build/crashes"

# Per target: larger inputs where the format needs them (a head of 16 KiB).
max_len() {
  case $1 in
    http_head) echo 20000 ;;
    *) echo 4096 ;;
  esac
}

status=0
summary=()
for t in "$@"; do
  bin=$build/fuzz_$t corpus=fuzz/corpus/$t new=$build/new/$t log=$build/log/$t.log
  mkdir -p "$new" "$corpus"
  if [ $merge = 1 ]; then
    tmp=$(mktemp -d)
    find "$corpus" -maxdepth 1 -type f \( -name 'seed-*' -o -name 'regress-*' \) \
      -exec cp {} "$tmp/" \;
    "$bin" -merge=1 -max_len="$(max_len "$t")" "$tmp" "$corpus" "$new" >"$log" 2>&1 || {
      echo "# fuzz_$t: merge failed, see $log"
      rm -rf "$tmp"
      status=1
      continue
    }
    rm -f "$corpus"/*
    cp "$tmp"/* "$corpus/"
    rm -rf "$tmp" "$new"
    summary+=("fuzz_$t: corpus $(ls "$corpus" | wc -l) files, $(du -sb "$corpus" | cut -f1) bytes")
    continue
  fi
  echo "# fuzz_$t: ${seconds} s"
  "$bin" -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/crashes/$t-" \
    "$new" "$corpus" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
  kept=$(ls "$corpus" | wc -l) found=$(ls "$new" | wc -l)
  line="fuzz_$t: ${secs:-?} s, ${execs:-?} execs, corpus $kept files (+$found new)"
  if [ $rc -ne 0 ]; then
    status=1
    summary+=("$line, FINDING (exit $rc): $(ls "$build/crashes/$t-"* 2>/dev/null | tr '\n' ' ')")
    grep -E 'invariant broken|ERROR: |SUMMARY: ' "$log" | head -n 5 | sed 's/^/#   /'
  else
    summary+=("$line, no finding")
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
