#!/usr/bin/env bash
# Issues 38, 42 and 43's GPU figures on a device machine (an H100 or H200; at most 10 minutes
# a call):
# the gpu tests, then for the 135M, 1.5B and 7B (Qwen2.5-7B) shapes with random weights our
# decode step at 64 rows (with a rank-8 adapter and on the base model) against compiled
# static-cache `generate` on the plain model, training's share of the measured bf16 rate at the
# device's default micro-batch budget, the RL step (64 x 64) and sampler-vs-trainer logprobs;
# issue 43's sweep: 8 RL runs of the 1.5B shape all at once in one engine against two at a
# time in private processes (part `sweep`, not in the default call); issue 52's pair: two RL runs
# on two bases (the 1.5B shape under two folder names) in two engine hosts sharing the GPU
# (budgets halved) against both in one host (part `hosts`, not in the default call either);
# issue 55's run across two hosts on GPU 0 (part `across`, not in the default call).
#
# Here, once (the device image lacks tinker and pydantic; .whl is git-ignored):
#     mkdir -p .git/info && echo /.whl/ >> .git/info/exclude && bash benchmarks/gpu_check.sh wheels
# There (the device tool), in one call (parts, in this order: tests, mixed, decode; all three
# took 352 s on an H200 with 2 mixed rounds and no profiles, the call 6 minutes with the
# machine's start; expect about 7 now):
#     run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
# and, in a second call while the machine is warm (its runs load the 1.5B shape 9 times; not
# yet timed on a GPU, expect about 3 minutes):
#     run(command="bash benchmarks/gpu_check.sh sweep", carry=[".whl"], timeout_s=400)
# and part `hosts` the same way (on an H200 on 2026-12-04, parts `tests hosts` in one call took
# 184 s, the call about 4 minutes with the machine's start: the gpu tests 37 s, the pair about
# 140 s, 35-38 s of it per case to start the hosts, load both bases and take a warm-up step):
#     run(command="bash benchmarks/gpu_check.sh hosts", carry=[".whl"], timeout_s=400)
# and part `across` (issue 55) the same way (not yet timed; expect about 3 minutes):
#     run(command="bash benchmarks/gpu_check.sh across", carry=[".whl"], timeout_s=400)
# Logs come back under $OUT (gpu_tests.log, random-135m.log, random-1.5b.log, random-7b.log,
# multi-adapter-random-135m.log, multi-adapter-random-1.5b.log, sweep-random-1.5b.log,
# hosts-random-1.5b.log and the engine hosts' own logs, hosts-{one,two}-0-host*.log,
# across-random-135m.log).
set -uo pipefail

if [ "${1:-}" = wheels ]; then
    # The versions uv.lock pins; the device runs CPython 3.12 on x86-64.
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl \
        tinker==0.38.0 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 \
        typing-inspection==0.4.5 distro==1.9.0 orjson==3.13.0 zstandard==0.25.0 sniffio==1.3.1 \
        pydantic-settings==2.16.3 python-dotenv==1.2.4
    # (the last two for part hosts: its runs and engine hosts build core.settings.Settings)
    exit
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c 'import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)' | tee -a "$OUT/device.txt"

PARTS="${*:-tests mixed decode}"
wants() { [[ " $PARTS " == *" $1 "* ]]; }

# --noconftest: tests/conftest.py builds the server app, whose packages (fastapi, sqlmodel,
# mcp, ...) the image lacks; the gpu tests need none of its fixtures. Without it no test carries
# its lane's marker, so the file is named instead of `-m gpu`; -W default: the image's
# transformers is another version than uv.lock's, whose warnings are not ours to fail on.
wants tests && timeout 210 python3 -m pytest --noconftest -W default tests/backend/gpu/test_gpu.py \
    tests/backend/gpu/test_gpu_groups.py -q -rP -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"

# Issue 42: 8 clients x 8 rows x 64 tokens on distinct adapters in mixed batches, against one
# client alone, one adapter per batch and 8 on one shared adapter (goal: 8 at least 5x one).
mixed() {
    timeout "$1" python3 -m benchmarks.multi_adapter --parts engine --device cuda --model "$2" \
        --counts 1,8 --rows 8 --tokens 64 --rounds 3 2>&1 | grep -v "Loading weights" \
        | tee "$OUT/multi-adapter-$2.log"
}
if wants mixed; then
    mixed 90 random-135m
    mixed 120 random-1.5b
fi

# Issue 43: a sweep of 8 runs x 3 RL steps (64 x 64) at 1.5B, all at once on one engine's
# training lanes against two at a time in processes of their own (goal: at least 2x sooner).
wants sweep && timeout 380 python3 -m benchmarks.training_lanes --device cuda \
    --model random-1.5b --runs 8 --at-once 2 --steps 3 2>&1 | grep -v "Loading weights" \
    | tee "$OUT/sweep-random-1.5b.log"

# Issue 52: two RL runs on two bases (the 1.5B shape twice, under two folder names), each in its
# own process, in one engine host and then in two hosts sharing GPU 0 (budgets halved): both
# finish, summed training tokens/s in two hosts at least 0.9x one host's. The hosts' own logs
# (kept in the benchmark's temporary folder) are copied out: a failed host says why only there.
wants hosts && timeout 330 python3 -m benchmarks.host_pair --device cuda --models random-1.5b \
    --group 16 --batch 6 --tokens 64 --steps 8 --host-logs "$OUT" 2>&1 \
    | grep -v "Loading weights\|Writing model" | tee "$OUT/hosts-random-1.5b.log"

# Issue 55: one run across two engine hosts sharing GPU 0 (NCCL refuses two ranks on one GPU:
# gloo on CUDA tensors). A step of 16 x 64 tokens on the 135M shape with `sample_hosts: 2`
# against one host (goal: at least 1.3x its sampling rate, one host being bound by its
# launches); a group of two (4 + 4 datums) against one host, 5 steps (goal: within 1e-3 of the
# largest weight, bf16); a sum all-reduce of 86M floats (7B's LoRA at rank 32). Not yet run on
# a GPU: expect about 3 minutes.
wants across && timeout 330 python3 -m benchmarks.across_hosts --device cuda --rounds 3 2>&1 \
    | grep -v "Loading weights\|Writing model" | tee "$OUT/across-random-135m.log"

# Each shape in its own process (its memory goes back); 64 rows x 64 tokens, as the goals say.
bench() {
    timeout "$1" python3 -m benchmarks.local_backend --models "$2" --prompts 64 \
        --static-prompts 64 --new-tokens 64 --train-sequences 64 --repeats 2 \
        --episodes 64 --episode-tokens 64 --tokens-per-microbatch "" "${@:3}" 2>&1 \
        | grep -v "Loading weights" | tee "$OUT/$2.log"
}
if wants decode; then
    bench 100 random-135m --profile  # the profiles: where a call's time goes beside its steps
    bench 120 random-1.5b
    bench 150 random-7b
fi
