#!/usr/bin/env bash
# needs: node
# Each export format is type-checked against the official SDKs' own types:
# `sbx tools --format F` becomes a TypeScript literal of the SDK's tool type
# and tsc (strict, excess-property checks) must accept it. TAP output.
set -u
here=$(cd "$(dirname "$0")" && pwd)
sbx=${SBX_BIN:?SBX_BIN must point at the sbx binary}
work=$(mktemp -d "$here/.types.XXXXXX")
trap 'rm -rf "$work"' EXIT
n=0 fail=0

check() { # name policy format flags type import
  local name=$1 policy=$2 format=$3 flags=$4 type=$5 import=$6 json
  n=$((n + 1))
  if ! json=$("$sbx" ${policy:+--policy "$policy"} tools --format "$format" $flags); then
    echo "not ok $n - $name: sbx tools failed"; fail=$((fail + 1)); return
  fi
  # Gemini's SDK types its schema types as a string enum: name its members.
  [ "$format" = gemini ] && json=$(sed -E 's/"type":"([A-Z]+)"/"type":Type.\1/g' <<<"$json")
  printf '%s\nconst tools: %s = %s;\nexport default tools;\n' "$import" "$type" "$json" > "$work/t$n.ts"
  local out
  if out=$(cd "$here" && node_modules/.bin/tsc --noEmit --strict --skipLibCheck false --target es2022 \
      --module nodenext --moduleResolution nodenext "$work/t$n.ts" 2>&1); then
    echo "ok $n - $name is a valid $type"
  else
    echo "not ok $n - $name is a valid $type"; fail=$((fail + 1))
    printf '%s\n' "$out" | head -20 | sed 's/^/#   /'
  fi
}

oa='import type { ChatCompletionTool } from "openai/resources/chat/completions";'
resp='import type { FunctionTool } from "openai/resources/responses/responses";'
an='import type { Tool } from "@anthropic-ai/sdk/resources/messages";'
gem='import { Type, type Tool } from "@google/genai";'
mcp='import type { Tool } from "@modelcontextprotocol/sdk/types.js";'
for pol in "" lm-deluge; do
  label=${pol:-default}
  check "$label openai strict" "$pol" openai "" "ChatCompletionTool[]" "$oa"
  check "$label openai non-strict" "$pol" openai --no-strict "ChatCompletionTool[]" "$oa"
  check "$label openai-responses" "$pol" openai-responses "" "FunctionTool[]" "$resp"
  check "$label anthropic" "$pol" anthropic "" "Tool[]" "$an"
  check "$label anthropic strict" "$pol" anthropic --strict "Tool[]" "$an"
  check "$label gemini" "$pol" gemini "" "Tool[]" "$gem"
  check "$label mcp" "$pol" mcp "" "Tool[]" "$mcp"
done

# Strict mode keeps optional parameters optional: nullable, not forced.
n=$((n + 1))
j=$("$sbx" tools --format openai)
if grep -q '"timeout":{"type":\["integer","null"\]' <<<"$j" && grep -q '"required":\["command","timeout","run_in_background","name"\]' <<<"$j"; then
  echo "ok $n - strict openai: every property listed, optional ones nullable"
else
  echo "not ok $n - strict openai: every property listed, optional ones nullable"; fail=$((fail + 1))
fi
n=$((n + 1))
j=$("$sbx" tools --format anthropic)
if grep -q '"required":\["command"\]' <<<"$j"; then
  echo "ok $n - non-strict anthropic keeps only command required"
else
  echo "not ok $n - non-strict anthropic keeps only command required"; fail=$((fail + 1))
fi
echo "1..$n"
[ "$fail" -eq 0 ]
