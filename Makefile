# make demo: set up, generate a demo project and train it, printing the result.
# make test: set up and run the template's test suite, in $(WORKERS) processes (pytest-xdist).
# make bench: set up, then time the generated project's training against a hand-written loop and a
#   bare Trainer (the MLP on digits and the CNN on images), each ratio checked against its ceiling.
# make bench-serve: set up, then time the generated project's serve over HTTP against predict.
# make bench-finetune: set up, then fine-tune a pretrained backbone against random weights, over 5 seeds.
# make bench-backbone: set up, then time the backbone's training on the CPU at 224, by num_workers.
# make bench-streaming: set up, then measure LitData shards: peak memory against a CSV's size, and
#   throughput against the same images as files.
# make bench-startup: set up, then time fit, test, predict and export on a tiny run, start-up
#   included, against `python -c "import lightning"` in the same rounds.
# make bench-sweep: set up, then time 8 trials of 4 epochs of scripts/sweep.py, trials started cold
#   and warm, against an in-process Optuna loop over a bare Trainer.
# make docs: build the documentation site into site/ (any warning fails).
# make release-check: fail if copier.yml, template/ or migrations/ changed since the newest release
#   (users would not get the change); make test-fast only warns of it.
# make tags: tag each release commit that CHANGELOG.md names as vX.Y.Z (annotated), for Copier;
#   running it again changes nothing, and it never moves a tag. Needs only git and sh.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch and torchvision, installed together before everything else so that nothing pulls in
# another build of torch: a torchvision only works beside the torch build it was made for.
TORCH ?= torch==2.14.1 torchvision==0.29.1
# Test processes: a generated project's training uses about one core, so two fill this machine's two.
WORKERS ?= 2

.PHONY: setup test test-fast release-check demo docs bench bench-serve bench-finetune bench-backbone bench-streaming bench-startup bench-sweep lint tags clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

test: setup
	$(BIN)/python -m pytest tests -n $(WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25

test-fast: setup
	@$(BIN)/python tests/release.py --warn
	$(BIN)/python -m pytest tests -m "not slow and not release" -n $(WORKERS) --dist loadgroup --no-loadscope-reorder

release-check:
	@$(PYTHON) tests/release.py

demo: setup
	rm -rf demo
	$(BIN)/copier copy --quiet --defaults --vcs-ref=HEAD --data project_name="Digits Demo" . demo
	$(BIN)/pip install --quiet --no-deps -e demo
	cd demo && ../$(BIN)/python -m digits_demo fit --run_name demo --trainer.enable_progress_bar=false
	cd demo && ../$(BIN)/python -m digits_demo test --ckpt_path "$$(ls checkpoints/demo/best-*.ckpt)" \
		--trainer.enable_progress_bar=false
	$(BIN)/python -c 'import json; fit, test = map(json.loads, open("demo/experiments.jsonl")); \
		print("\ndemo: best %s %.4f at epoch %d, test/acc %.4f, training %.1f s, checkpoint %s" % (fit["monitor"], \
		fit["best_value"], fit["best_epoch"], test["test"]["test/acc"], fit["wall_time_s"], fit["best_checkpoint"]))'

docs: setup
	$(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/python bench/run.py

bench-serve: setup
	$(BIN)/python bench/serve.py

bench-finetune: setup
	$(BIN)/python bench/finetune.py

bench-backbone: setup
	$(BIN)/python bench/backbone_speed.py

bench-streaming: setup
	rm -rf /tmp/bench-streaming
	$(BIN)/copier copy --quiet --defaults --trust --vcs-ref=HEAD --data project_name="Bench Streaming" . /tmp/bench-streaming
	cd /tmp/bench-streaming && PYTHONPATH=src $(CURDIR)/$(BIN)/python $(CURDIR)/bench/streaming.py \
		--package bench_streaming --mb 300

bench-startup: setup
	$(BIN)/python bench/startup.py

bench-sweep: setup
	$(BIN)/python bench/sweep.py

lint: setup
	$(BIN)/ruff check tests migrations
	$(BIN)/ruff format --check tests migrations

# Copier finds releases by their tags; CHANGELOG.md names them, `## vX.Y.Z (commit <short sha>)`.
# A tag already on its commit is left as it is; one on another commit is an error.
tags:
	@sed -nE 's/^## (v[0-9]+\.[0-9]+\.[0-9]+) \(commit ([0-9a-f]{7,40})\).*/\1 \2/p' CHANGELOG.md | \
	while read -r tag commit; do \
		full=$$(git rev-parse --verify --quiet "$$commit^{commit}") || { \
			echo "make tags: $$tag: commit $$commit is not in this clone (shallow? git fetch --unshallow)" >&2; \
			exit 1; }; \
		if tagged=$$(git rev-parse --verify --quiet "refs/tags/$$tag^{commit}"); then \
			[ "$$tagged" = "$$full" ] || { \
				echo "make tags: $$tag already tags commit $$(git rev-parse --short "$$tagged")," \
					"not $$commit as CHANGELOG.md says; a tag is never moved" >&2; \
				exit 1; }; \
		else \
			git tag --annotate --message "$$tag" "$$tag" "$$full" || exit 1; \
			echo "tagged $$tag: commit $$commit"; \
		fi; \
	done

clean:
	rm -rf $(VENV) demo
