-- The shell side of a session (box:session()): each command runs in a new
-- shell process, so its exit status is the one the agent (or the exec
-- transport) reads with waitpid, never anything printed inside the box.
-- What carries over from one command to the next is the shell's state,
-- which the wrapper saves after the command (an EXIT trap, in a subshell:
-- whatever the saving runs into, it cannot change the shell's status) and
-- restores before the next, from a file in the box:
--   bash: the working directory, variables (exported or not, arrays too;
--         not readonly ones nor bash's own), functions, aliases (expanded,
--         as at a prompt), shopt and set -o options, umask.
--   sh (busybox ash, dash): the working directory, exported variables,
--         aliases, set -o options, umask. Not unexported variables, not
--         functions (ash cannot list them).
-- Never carried: traps, background jobs (the job table), positional
-- parameters, readonly attributes.
--
-- A command may change what later commands do (the state is the session's:
-- a function named false, an alias, a changed PATH), never what sbx reports
-- about them: the status and the end of the output are the new process's.
-- The wrapper's own names are guarded where the shell allows it: in bash
-- the saving function is readonly and the trap names it quoted (no alias),
-- and the saver enters POSIX mode, where special builtins come before
-- functions, to remove a function named builtin before calling builtins
-- through it; in sh it calls builtins through unset -f (a special builtin).
-- A command that defeats the saving (trap - EXIT, exec, kill -9 $$) only
-- loses its own changes: the next command starts from the last saved state.
local M = {}

-- Each script is one line (the newlines below become spaces), so the
-- shell's messages count the command's own lines ("line 1").
local function one_line(script) return (script:gsub("\n%s*", " ")) end

M.bash = one_line [=[
readonly __sbx_f="$SBX_SESSION_STATE" __sbx_c="$1"; unset SBX_SESSION_STATE; shift;
__sbx_save() {
  ( __sbx_bo=$BASHOPTS __sbx_so=$SHELLOPTS;
    [[ -o posix ]] || POSIXLY_CORRECT=y;
    if [[ -o posix ]]; then
      unset -f builtin;
      builtin set +o posix; builtin unset POSIXLY_CORRECT; IFS=$' \t\n';
      builtin set +x +e +u;
      for __sbx_v in $(builtin compgen -v); do
        case $__sbx_v in
          __sbx_*|BASH*|SHELLOPTS|PPID|EUID|UID|GROUPS|FUNCNAME|LINENO|RANDOM|SRANDOM|SECONDS|HISTCMD|PIPESTATUS|DIRSTACK|EPOCH*|_|PWD|SHLVL|POSIXLY_CORRECT|COMP_WORDBREAKS|IFS) continue ;;
        esac;
        [[ ${!__sbx_v@a} == *r* ]] && continue;
        builtin declare -p "$__sbx_v";
      done;
      for __sbx_v in $(builtin compgen -A shopt); do
        [[ :$__sbx_bo: == *:$__sbx_v:* ]] && __sbx_l=-s || __sbx_l=-u;
        builtin printf 'shopt %s %s\n' $__sbx_l $__sbx_v;
      done;
      for __sbx_v in $(builtin compgen -A function); do
        [[ $__sbx_v == __sbx_* || $__sbx_v == eval ]] || builtin declare -f "$__sbx_v";
      done;
      builtin alias -p;
      builtin umask -p;
      builtin printf 'builtin cd -- %q\n' "$PWD";
      for __sbx_v in $(builtin compgen -A setopt); do
        [[ :$__sbx_so: == *:$__sbx_v:* ]] && __sbx_l=- || __sbx_l=+;
        builtin printf 'set %so %s\n' $__sbx_l $__sbx_v;
      done;
    fi ) >|"$__sbx_f" 2>/dev/null;
};
readonly -f __sbx_save; trap \\__sbx_save EXIT; shopt -s expand_aliases;
{ [[ -r $__sbx_f ]] && . "$__sbx_f" 2>/dev/null; eval "$__sbx_c"; }
]=]

M.sh = one_line [=[
__sbx_f=$SBX_SESSION_STATE __sbx_c=$1; readonly __sbx_f __sbx_c; unset SBX_SESSION_STATE; shift;
trap '( \unset -f alias umask pwd printf read command cd;
  \export -p; \alias | while IFS= \read -r __sbx_l; do \printf "alias %s\n" "$__sbx_l"; done;
  \printf "umask %s\n" "$(\umask)"; \printf "cd -- '"'"'%s'"'"'\n" "$PWD"; \set +o ) >|"$__sbx_f" 2>/dev/null' EXIT;
{ if [ -r "$__sbx_f" ]; then . "$__sbx_f"; fi 2>/dev/null; eval "$__sbx_c"; }
]=]

-- argv(launcher, command) -> the argv of one session command: the policy's
-- launcher (which picks bash or sh and runs script "$1" or "$2" with the
-- command as its "$1"), both scripts and the command. The script restores
-- the state and evals the command in one compound command, parsed before
-- any restored alias exists; a restored function named eval is never
-- saved, so the eval is the shell's own.
function M.argv(launcher, command)
  local argv = {}
  for i, a in ipairs(launcher) do argv[i] = a end
  argv[#argv + 1] = M.bash
  argv[#argv + 1] = M.sh
  argv[#argv + 1] = command
  return argv
end

return M
