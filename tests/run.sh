#!/usr/bin/env bash
# The test runner: every C unit test, the embedding test, a stock lua5.4
# loading sbx.so, and every tests/*_test.lua under the real sbx against the
# real daemon. Each file runs in its own process with a time limit and must
# print TAP: "ok N", "not ok N", "ok N # SKIP reason", and a plan "1..N"
# before its first or after its last test line. A file fails when an
# assertion fails, when its plan is missing or does not match what ran (it
# stopped early), when it exits non-zero or times out, or when it ran no
# assertion. A whole run (no PATTERN) that leaves the git checkout changed
# (a file a test wrote into the tree) counts one more failure, clean_tree.
# The run ends with "N passed, N failed, N skipped".
#
# Each test file (and each fuzz/fuzz_X.c, for its replay_X over the corpus)
# says near its top what it needs beyond the build, in a
# comment line "needs: WORD, WORD" ("-- needs:" in Lua, "# needs:" in
# Python and shell, "/* needs: */" in C, "// needs:" in JavaScript; "needs: nothing" for
# none). A file whose need is missing here is not run and is counted as
# skipped, with the reason. The words:
#   docker       a Docker (or Podman) daemon answers where sbx looks for one
#   local        the local backend can make boxes: bwrap, user namespaces
#   root         the runner is root
#   network      the internet: only with SBX_TEST_NETWORK=1 (no file needs
#                it today; the suite runs offline)
#   python3:MOD  python3 can import MOD
#   any other    a program of that name on PATH (python3, node, socat, ...)
# SBX_TEST_UNIT=1 (make test-unit) runs only the files that need none of
# docker, local, root and network: what a laptop without Docker can run.
#   tests/run.sh [BUILD_DIR] [PATTERN]
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
pattern=${2:-}
export SBX_TEST_IMAGE=${SBX_TEST_IMAGE:-sbx-debian:12}
export SBX_TEST_BUSYBOX=${SBX_TEST_BUSYBOX:-sbx-busybox:latest}
export SBX_BIN="$PWD/$build/sbx"
export LUA_PATH="$PWD/tests/lib/?.lua;;"   # tap, helpers, the fake backend, suites
# backend = "auto" picks Docker in this suite wherever a daemon answers
# (tests/data/suite_policy.lua); backend_auto_test.lua tries auto itself.
export SBX_POLICY=${SBX_POLICY:-$PWD/tests/data/suite_policy.lua}
limit=${SBX_TEST_TIMEOUT:-600}

unit=${SBX_TEST_UNIT:-}

passed=0 failed=0 skipped=0
failures=() skips=() not_unit=()

# The tree stays clean: what git sees as changed or untracked (ignored
# files aside: build/, bench-out/, ...) is the same after the run as before
# it, so no test leaves a file in the checkout. Outside a git checkout
# there is nothing to compare.
tree_state() {
  [ -z "$pattern" ] && git rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
    git status --porcelain --untracked-files=all 2>/dev/null | sort
}
tree_before=$(tree_state || true)

# needs_of FILE: the words of FILE's "needs:" line (among its first 30
# lines), blank-separated; nothing when it says "nothing" or has none.
needs_of() {
  sed -n -E '1,30{s@^[[:space:]]*(--|#|//|/\*)[[:space:]]*needs:[[:space:]]*@@p}' "$1" 2>/dev/null |
    head -n 1 | sed -e 's#\*/##' -e 's/,/ /g' -e 's/\<nothing\>//'
}

# test_source NAME ARGS...: the file a run_one line runs: the first
# argument that is a file under tests/, else tests/NAME.c (a C unit test),
# else fuzz/fuzz_X.c for replay_X (a fuzz target over its corpus).
test_source() {
  local name=$1 a; shift
  for a in "$@"; do
    [[ $a == tests/* && -f $a ]] && { echo "$a"; return; }
  done
  if [ -f "tests/$name.c" ]; then
    echo "tests/$name.c"
  elif [[ $name == replay_* && -f fuzz/fuzz_${name#replay_}.c ]]; then
    echo "fuzz/fuzz_${name#replay_}.c"
  fi
}

# missing NEED: sets why_missing to why NEED is not met here (empty when
# it is). Each answer is worked out once per run.
declare -A need_answer=()
why_missing=
missing() {
  local need=$1 why=
  if [ -n "${need_answer[$need]+set}" ]; then
    why_missing=${need_answer[$need]}
    return
  fi
  case $need in
    docker)
      # sbx's own search (DOCKER_HOST, then the usual sockets), with a bound.
      local probe
      probe=$(mktemp)
      # (Its output, not its status: under make check a leak report at
      # exit would turn a daemon that answers into one that does not.)
      echo 'print(require("sbx.backends.docker").connect() and "answers" or "no")' > "$probe"
      [ "$(timeout -k 5 30 "$SBX_BIN" run "$probe" 2>/dev/null)" = answers ] || why="no Docker daemon answers"
      rm -f "$probe" ;;
    local)
      if ! command -v bwrap >/dev/null; then
        why="no bwrap (bubblewrap) on PATH"
      elif ! unshare --user --map-root-user true 2>/dev/null; then
        why="user namespaces are not allowed here"
      fi ;;
    root) [ "$(id -u)" -eq 0 ] || why="not root" ;;
    network) [ -n "${SBX_TEST_NETWORK:-}" ] || why="the suite runs offline (SBX_TEST_NETWORK=1 allows it)" ;;
    python3:*)
      /usr/bin/python3 -c "import ${need#python3:}" 2>/dev/null || why="python3 cannot import ${need#python3:}" ;;
    *) command -v "$need" >/dev/null || why="no $need on PATH" ;;
  esac
  need_answer[$need]=$why
  why_missing=$why
}

# tap_counts: reads TAP on stdin and prints
#   passed failed skipped todo tests plans plan plan_where
# A "# SKIP" directive (any case) on an "ok" line is a skip; "not ok" with
# "# TODO" is an expected failure, counted as neither. plan_where is
# "start" (before any test line), "end" (after the last one) or "middle".
tap_counts() {
  awk '
    /^(not )?ok([ \t]|$)/ {
      tests++
      line = tolower($0)
      skip = line ~ /#[ \t]*skip/
      todo = line ~ /#[ \t]*todo/
      if ($1 == "ok") { if (skip) skips++; else pass++ }
      else if (todo) todos++
      else fails++
      next
    }
    /^1\.\.[0-9]+/ {
      plans++
      plan = substr($0, 4) + 0
      plan_at = tests
      next
    }
    END {
      where = "none"
      if (plans) where = plan_at == 0 ? "start" : (plan_at == tests ? "end" : "middle")
      print pass + 0, fails + 0, skips + 0, todos + 0, tests + 0, plans + 0, plan + 0, where
    }'
}

run_one() {
  local name=$1; shift
  [ -n "$pattern" ] && [[ $name != *$pattern* ]] && return
  local src need why=() words
  src=$(test_source "$name" "$@")
  words=$([ -n "$src" ] && needs_of "$src")
  for need in $words; do
    if [ -n "$unit" ] && [[ " docker local root network " == *" $need "* ]]; then
      not_unit+=("$name")
      return
    fi
    missing "$need"
    [ -n "$why_missing" ] && why+=("$need: $why_missing")
  done
  if [ ${#why[@]} -gt 0 ]; then
    local reason
    reason=$(printf '%s; ' "${why[@]}")
    reason=${reason%; }
    echo "# --- $name"
    echo "# $name skipped: needs $reason"
    skipped=$((skipped + 1))
    skips+=("$name (needs $reason)")
    return
  fi
  local out rc
  echo "# --- $name"
  out=$(timeout -k 10 "$limit" "$@" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  local ok bad skip todo tests plans plan where
  read -r ok bad skip todo tests plans plan where < <(tap_counts <<<"$out")
  passed=$((passed + ok))
  failed=$((failed + bad))
  skipped=$((skipped + skip))
  [ "$skip" -gt 0 ] && skips+=("$name ($skip)")
  # Whatever else is wrong with the file counts as one more failure.
  local why=()
  if [ "$plans" -eq 0 ]; then
    why+=("no plan")
  elif [ "$plans" -gt 1 ]; then
    why+=("$plans plans")
  elif [ "$where" = middle ]; then
    why+=("plan in the middle")
  elif [ "$tests" -lt "$plan" ]; then
    why+=("stopped early: $tests of $plan")
  elif [ "$tests" -gt "$plan" ]; then
    why+=("$tests tests, plan says $plan")
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    why+=("timed out after ${limit}s")
  elif [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
    # A crash outside any assertion still counts as a failure.
    why+=("exit $rc")
  fi
  [ "$tests" -eq 0 ] && why+=("ran no assertion")
  if [ ${#why[@]} -gt 0 ]; then
    failed=$((failed + 1))
    [ "$bad" -gt 0 ] && why=("$bad failed" "${why[@]}")
    local reason
    reason=$(printf '%s, ' "${why[@]}")
    reason=${reason%, }
    echo "# $name failed: $reason"
    failures+=("$name ($reason)")
  elif [ "$bad" -gt 0 ]; then
    failures+=("$name ($bad failed)")
  fi
}

run_one unit_capture "$build/unit_capture"
# The fuzz targets over their checked-in corpora (make fuzz does the fuzzing).
run_one replay_demux "$build/replay_demux" fuzz/corpus/demux
run_one replay_http_head "$build/replay_http_head" fuzz/corpus/http_head
run_one replay_utf8 "$build/replay_utf8" fuzz/corpus/utf8
run_one replay_ssm "$build/replay_ssm" fuzz/corpus/ssm
run_one replay_sigv4 "$build/replay_sigv4" fuzz/corpus/sigv4
run_one replay_agent "$build/replay_agent" fuzz/corpus/agent
run_one replay_layer "$build/replay_layer" fuzz/corpus/layer
run_one replay_pty_escape "$build/replay_pty_escape" fuzz/corpus/pty_escape
run_one replay_tar "$build/replay_tar" fuzz/corpus/tar
# Vectors from the official AWS projects (licenses in tests/data/*/).
run_one unit_sigv4 "$build/unit_sigv4" tests/data/aws-sigv4
run_one unit_ssm "$build/unit_ssm" tests/data/ssm/vectors.jsonl
run_one unit_pty_escape "$build/unit_pty_escape"
run_one embed_test "$build/embed_test"
# A sanitized sbx.so inside an unsanitized lua5.4 needs the runtimes first.
preload=
if [ -n "${SBX_SANITIZED:-}" ]; then
  preload="$(${CC:-cc} -print-file-name=libasan.so):$(${CC:-cc} -print-file-name=libubsan.so)"
fi
if [ -z "${SBX_SANITIZED:-}" ]; then
  run_one install_test tests/install_test.sh "$build"
  run_one rockspec_test tests/rockspec_test.sh
fi
run_one stock_lua env LD_PRELOAD="$preload" LUA_CPATH="$PWD/$build/?.so;;" lua5.4 tests/stock_lua.lua
if command -v node >/dev/null && [ -d tests/sdk/node_modules ]; then
  run_one sdk_types tests/sdk/types_test.sh
  run_one mcp_test node tests/sdk/mcp_test.mjs
fi
# The AWS stand-in, driven by the official Python client (botocore).
run_one standin_botocore /usr/bin/python3 tests/standin_botocore_test.py
run_one standin_ssm /usr/bin/python3 tests/standin_ssm_test.py
# sbx-agent against an independent client (both architectures; aarch64 under qemu-user).
run_one agent_proto /usr/bin/python3 tests/agent_proto_test.py "$build"
for f in tests/*_test.lua; do
  run_one "$(basename "$f" .lua)" "$build/sbx" run "$f"
done

tree_after=$(tree_state || true)
if [ "$tree_before" != "$tree_after" ]; then
  echo "# the run left the checkout changed (a test wrote into the tree):"
  diff <(printf '%s\n' "$tree_before") <(printf '%s\n' "$tree_after") | sed -n 's/^> /#   /p'
  failed=$((failed + 1))
  failures+=("clean_tree")
fi

[ ${#not_unit[@]} -gt 0 ] && echo "# not in the unit run (they need docker, local, root or network): ${not_unit[*]}"
[ ${#skips[@]} -gt 0 ] && echo "# skipped: ${skips[*]}"
if [ ${#failures[@]} -gt 0 ]; then
  echo "# failed: ${failures[*]}"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
