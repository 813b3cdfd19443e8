#!/usr/bin/env bash
# Makes the wheels lab/bench/trl_verl_gpu_session.sh installs on the GPU machine, on the CPU machine,
# from PyPI (writes .carry/trl and .carry/verl, gitignored; ~5 MB together; a minute):
#     bash lab/bench/trl_verl_carry.sh
# Each package --no-deps for CPython 3.12 manylinux, only those the device image lacks (KINDS.md's list)
# at the versions the repo tests: TRL as pyproject pins it and datasets as the test environment holds
# it (.carry/trl); verl 0.9.1 and what its FSDP engine imports (.carry/verl). Not carried: Ray (verl's
# `import verl` names it only; lab/bench/verl_without_ray stands in), torchdata, wandb, pylatexenc
# (verl's trainer and reward code, not its engine). antlr4-python3-runtime 4.9.3 (omegaconf's pin) is
# published as a source archive only; it is pure Python and built into a wheel here.
set -euo pipefail
P=(--no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
rm -rf .carry/trl .carry/verl && mkdir -p .carry/trl .carry/verl
pip download -q "${P[@]}" -d .carry/trl trl==1.16.0 datasets==5.2.0 "dill==0.4.1" "multiprocess==0.70.19"
pip download -q "${P[@]}" -d .carry/verl verl==0.9.1 omegaconf==2.3.0 hydra-core==1.3.2 tensordict==0.10.0 \
  codetiming==1.4.0 orjson==3.13.0 "pyvers==0.1.0" importlib_metadata==10.2.0
pip wheel -q --no-deps -w .carry/verl antlr4-python3-runtime==4.9.3
ls -la .carry/trl .carry/verl
du -sh .carry/trl .carry/verl
