#!/usr/bin/env bash
# Report the sandbox's view of the machine; writes report.txt and result.json.
set -euo pipefail

kernel=$(uname -sr)
host=$(hostname 2>/dev/null || cat /proc/sys/kernel/hostname)
files=$(ls -1 | wc -l)

echo "kernel:   $kernel"
echo "hostname: $host"
echo "workdir:  $(pwd) ($files files)"
echo "user:     $(id -u)"

{
  echo "kernel $kernel"
  echo "hostname $host"
  ls -l
} > "$FLOOM_OUTPUT_DIR/report.txt"

printf '{"outputs": {"kernel": "%s", "hostname": "%s", "files": %d}}\n' \
  "$kernel" "$host" "$files" > result.json
