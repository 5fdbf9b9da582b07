#!/usr/bin/env bash
# install_test_deps.sh — the Debian packages the SLURM tests need (tests/test_slurm.py starts a one-node
# cluster from them): slurm-wlm (slurmctld, slurmd, sbatch, squeue, scontrol) and munge (its auth daemon);
# and g++ (with gcc), which inductor compiles with (train.py --compile on CPU, tests/test_train.py's compile test)
# and cpu_attention.py builds its C kernel with (every CPU run's attention, tests/test_model.py).
# Idempotent: installs only what is missing, prints one line either way. Needs root and apt-get.
set -euo pipefail

missing=()
for tool in slurmctld:slurm-wlm slurmd:slurm-wlm sbatch:slurm-wlm munged:munge g++:g++; do
  if ! command -v "${tool%%:*}" >/dev/null 2>&1; then
    missing+=("${tool#*:}")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install_test_deps.sh: slurm-wlm, munge and g++ are installed"
  exit 0
fi
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_test_deps.sh: missing $packages and no apt-get here: install them with your package manager" >&2
  exit 2
fi
start=$SECONDS
# Quiet and non-interactive: the packages' post-install questions (munge's key, slurm's config) take defaults.
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
# shellcheck disable=SC2086  # one word per package
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages; } > "$log" 2>&1; then
  echo "install_test_deps.sh: apt-get could not install ${packages% }:" >&2
  tail -n 5 "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
echo "install_test_deps.sh: installed ${packages% } in $(( SECONDS - start )) s"
