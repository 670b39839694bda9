# flowtune developer entry points. `make test` sets up what is missing and runs every check.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c

export FLOWTUNE_CACHE ?= $(HOME)/.cache/flowtune
export FLOWTUNE_VENV ?= $(FLOWTUNE_CACHE)/venv
ENV := source scripts/env.sh &&

.PHONY: demo test setup build fmt gpu-bundle

## demo: Flow-GRPO on the shipped shapes model (CPU, minutes); pictures and summary in runs/demo
demo: build
	$(ENV) target/release/flowtune demo --out runs/demo

## test: set up the torch venv if needed, check formatting and lints, run the whole test suite
test: setup
	$(ENV) cargo fmt --all -- --check
	$(ENV) cargo clippy --release --workspace --all-targets -- -D warnings
	$(ENV) cargo test --release --workspace -- --nocapture

## setup: install torch==2.11.0 (+ the CUDA headers flowtune-dist's NCCL needs) into $(FLOWTUNE_VENV), the OCR models into $(FLOWTUNE_CACHE)/ocr and diffusers for the GPU suite's anchors into $(FLOWTUNE_CACHE)/anchors (once)
setup:
	scripts/setup.sh
	scripts/setup-dist.sh
	scripts/setup-rewards.sh
	scripts/setup-anchors.sh

## build: the release binary target/release/flowtune
build: setup
	$(ENV) cargo build --release --bin flowtune

## fmt: format the workspace
fmt:
	cargo fmt --all

## gpu-bundle: the GPU suite's binary, scripts, configs, fixtures and diffusers wheel in gpu-bundle/ (ignored, ≤ 60 MiB)
gpu-bundle: build
	scripts/gpu/bundle.sh
