#!/usr/bin/env bash
# The test runner: every C unit test, the embedding test, a stock lua5.4
# loading sbx.so, and every tests/*_test.lua under the real sbx against the
# real daemon. Each file runs in its own process with a time limit; TAP lines
# are counted and the run ends with "N passed, N failed".
#   tests/run.sh [BUILD_DIR] [PATTERN]
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
pattern=${2:-}
export SBX_TEST_IMAGE=${SBX_TEST_IMAGE:-sbx-debian:12}
export SBX_TEST_BUSYBOX=${SBX_TEST_BUSYBOX:-sbx-busybox:latest}
export SBX_BIN="$PWD/$build/sbx"
export LUA_PATH="$PWD/tests/?.lua;;"
limit=${SBX_TEST_TIMEOUT:-600}

passed=0 failed=0
failures=()

run_one() {
  local name=$1; shift
  [ -n "$pattern" ] && [[ $name != *$pattern* ]] && return
  local out rc
  echo "# --- $name"
  out=$(timeout -k 10 "$limit" "$@" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  local ok bad
  ok=$(grep -c '^ok ' <<<"$out")
  bad=$(grep -c '^not ok ' <<<"$out")
  passed=$((passed + ok))
  failed=$((failed + bad))
  if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
    # A crash or a timeout outside any assertion still counts as a failure.
    failed=$((failed + 1))
    failures+=("$name (exit $rc)")
  elif [ "$bad" -gt 0 ]; then
    failures+=("$name ($bad failed)")
  elif [ "$ok" -eq 0 ]; then
    failed=$((failed + 1))
    failures+=("$name (ran no assertion)")
  fi
}

run_one unit_capture "$build/unit_capture"
# The fuzz targets over their checked-in corpora (make fuzz does the fuzzing).
run_one replay_demux "$build/replay_demux" fuzz/corpus/demux
run_one replay_http_head "$build/replay_http_head" fuzz/corpus/http_head
run_one replay_utf8 "$build/replay_utf8" fuzz/corpus/utf8
run_one replay_ssm "$build/replay_ssm" fuzz/corpus/ssm
run_one replay_sigv4 "$build/replay_sigv4" fuzz/corpus/sigv4
# The AWS suites live in ../shared (next to the clone, read-only in CI).
run_one unit_sigv4 "$build/unit_sigv4" "${SBX_SHARED:-../shared}/testdata/aws-sigv4"
run_one unit_ssm "$build/unit_ssm" "${SBX_SHARED:-../shared}/testdata/ssm/vectors.jsonl"
run_one embed_test "$build/embed_test"
# A sanitized sbx.so inside an unsanitized lua5.4 needs the runtimes first.
preload=
if [ -n "${SBX_SANITIZED:-}" ]; then
  preload="$(${CC:-cc} -print-file-name=libasan.so):$(${CC:-cc} -print-file-name=libubsan.so)"
fi
[ -z "${SBX_SANITIZED:-}" ] && run_one install_test tests/install_test.sh "$build"
run_one stock_lua env LD_PRELOAD="$preload" LUA_CPATH="$PWD/$build/?.so;;" lua5.4 tests/stock_lua.lua
if command -v node >/dev/null && [ -d tests/sdk/node_modules ]; then
  run_one sdk_types tests/sdk/types_test.sh
  run_one mcp_test node tests/sdk/mcp_test.mjs
fi
# The AWS stand-in, driven by the official Python client (botocore).
run_one standin_botocore /usr/bin/python3 tests/standin_botocore_test.py
run_one standin_ssm /usr/bin/python3 tests/standin_ssm_test.py
for f in tests/*_test.lua; do
  run_one "$(basename "$f" .lua)" "$build/sbx" run "$f"
done

if [ ${#failures[@]} -gt 0 ]; then
  echo "# failed: ${failures[*]}"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
