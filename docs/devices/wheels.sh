#!/usr/bin/env bash
# Before a GPU window, here (with network): the Python packages the window's machine lacks, as wheels in .whl/
# (ignored by .gitignore; the window's `run` carries it). That machine has Python 3.12,
# torch and most of transformers' needs, but transformers 5.17 (spec-zoo needs >= 5.20: with 5.17 EAGLE and
# lookahead fail and suffix decoding leaves plain greedy output) and no hydra-core or omegaconf. About 18 MB.
set -eu
cd "$(dirname "$0")/../.."
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    transformers==5.25.0 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
    kernels==0.19.1 tomlkit==0.15.3 hydra-core==1.3.8 omegaconf==2.3.1
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # published as an sdist only: built here
# what the window carries beside the tree, in bytes: tests/test_repo_size.py adds it to the tree's size
(cd .whl && stat -c '%s %n' -- *) > docs/devices/wheels.txt
du -sh .whl && ls .whl
