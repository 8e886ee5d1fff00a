#!/usr/bin/env bash
# Writes one patch of the kubelet series (kubelet/patches/) from two source trees: the series applied up to the
# patch before (A, e.g. from `hack/build-kubelet-delegating.sh --source`) and the same tree edited (B).
#
#   hack/kubelet-patch-from-trees.sh A B kubelet/patches/NNNN-name.patch "subject line" [body file]
#
# The patch is git's unified format without timestamps, with the subject (and body) first, as `git format-patch`
# writes them; `patch -p1` skips that header.
set -euo pipefail
a=${1:?A}; b=${2:?B}; out=${3:?OUT}; subject=${4:?SUBJECT}; body=${5:-}
{
  echo "Subject: [PATCH] $subject"
  echo
  [ -z "$body" ] || { cat "$body"; echo; }
  echo "---"
  (cd "$(dirname "$a")" && diff -ruN --exclude='*.orig' "$(basename "$a")" "$(basename "$b")" || [ $? -eq 1 ]) |
    sed -E "s#^diff -ruN '--exclude=[^']+' [^/]+/([^ ]+) [^ ]+#diff --git a/\1 b/\1#;
            s#^--- [^/]+/([^\t]+)\t.*#--- a/\1#; s#^\+\+\+ [^/]+/([^\t]+)\t.*#+++ b/\1#"
} >"$out"
echo "$out: $(grep -c '^diff --git' "$out") files"
