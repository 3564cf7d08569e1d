"""The whole reproducible pipeline that builds the demo pair (``edgespec train-demo``).

Stages, in order (``--stages`` picks a subset; ``--resume`` continues any stage that left a
checkpoint and skips stages whose output exists):

  data     split the stdlib by file, train the BPE tokenizer, encode, cut prompts
  target   pretrain the deep narrow target (hours of CPU: the one to start early)
  draft    pretrain the two-layer draft on the same tokens (or grow one given with --draft-init)
  generate the target's greedy continuations of training windows (what greedy verification
           asks the draft to guess), made once for every epoch of distillation
  distill  align the draft to the target (KL(p||q), see edgespec.cloud.training.distill),
           the generated share of the steps on the generate stage's text
  eval     losses, alpha, greedy agreement, simulated acceptance length on held-out data
  export   the shipped draft to ONNX for the device (--ship/draft: model.onnx, tokenizer, manifest)
  ship     copy the small artefacts (fp16 target, draft HF dir, metrics) into --ship

Layout under ``--out``: data/, target/, draft/, target-text/, distill/, eval/metrics.json. Under ``--ship``:
target/ (fp16), draft-hf/, draft/ (ONNX), metrics.json.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from edgespec.cloud.demo.models import DRAFT_SHAPES, TARGET_SHAPES
from edgespec.cloud.training.loop import Budget, LRSchedule, checkpoint_exists

INVOCATIONS = "train_demo_invocations.jsonl"
STAGES = ("data", "target", "draft", "generate", "distill", "eval", "export", "ship")


@dataclass(frozen=True)
class TrainDemoConfig:
    out: Path = Path("runs/demo")
    ship: Path = Path("models/demo")
    prompts: Path = Path("prompts")
    stages: tuple[str, ...] = STAGES
    resume: bool = False
    threads: int = 1
    seed: int = 0
    target_shape: str = "12x192"
    target_minutes: float = 210.0
    target_tokens: int = 12_000_000
    target_lr: float = 2e-3
    draft_shape: str = "2x128"
    draft_init: Path | None = None  # start the draft from this model, grown to draft_shape (None: random)
    draft_minutes: float = 45.0
    draft_tokens: int = 12_000_000
    draft_lr: float = 3e-3
    generate_minutes: float = 50.0
    generate_sequences: int = 8192
    distill_minutes: float = 42.0
    distill_temperature: float = 1.0
    distill_generated_fraction: float = 0.7
    distill_ce_weight: float = 0.0
    eval_prompts: int = 64

    def __post_init__(self) -> None:
        for name in ("out", "ship", "prompts"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        if self.draft_init is not None:
            object.__setattr__(self, "draft_init", Path(self.draft_init))
        if self.draft_shape not in DRAFT_SHAPES:
            raise ValueError(f"draft_shape must be one of {sorted(DRAFT_SHAPES)}, got {self.draft_shape!r}")
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown or not self.stages:
            raise ValueError(f"stages must be a non-empty subset of {','.join(STAGES)}, got {','.join(self.stages)}")
        if self.target_shape not in TARGET_SHAPES:
            raise ValueError(f"target_shape must be one of {sorted(TARGET_SHAPES)}, got {self.target_shape!r}")
        for name in ("threads", "eval_prompts", "generate_sequences"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("target_minutes", "draft_minutes", "generate_minutes", "distill_minutes", "target_tokens", "draft_tokens",
                     "distill_ce_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.distill_generated_fraction <= 1:
            raise ValueError(f"distill_generated_fraction must be in [0, 1], got {self.distill_generated_fraction}")

    @property
    def data_dir(self) -> Path:
        return self.out / "data"


def _banner(stage: str) -> None:
    print(f"\n=== train-demo: {stage} ({time.strftime('%H:%M:%S')}) ===", flush=True)


def _guard_fresh(path: Path, config: TrainDemoConfig) -> None:
    if checkpoint_exists(path) and not config.resume:
        raise SystemExit(f"{path} already holds a checkpoint: pass --resume to continue it, or choose another --out")


def stage_data(config: TrainDemoConfig) -> None:
    from edgespec.cloud.demo.data import DataConfig, copy_prompts, is_prepared, prepare_data

    if is_prepared(config.data_dir) and config.resume:
        print(f"data: {config.data_dir} is prepared; reusing it")
    else:
        prepare_data(DataConfig(config.data_dir))
    copy_prompts(config.data_dir, config.prompts)
    print(f"data: prompts and split manifest copied to {config.prompts}/")


def _pretrain(config: TrainDemoConfig, name: str, shape, minutes: float, tokens: int, lr: float, init: Path | None = None) -> None:
    from edgespec.cloud.demo.pretrain import PretrainConfig, pretrain

    out = config.out / name
    _guard_fresh(out / "checkpoint", config)
    pretrain(
        PretrainConfig(
            data_dir=config.data_dir,
            out_dir=out,
            shape=shape,
            budget=Budget(tokens=tokens, minutes=minutes),
            schedule=LRSchedule(peak=lr, warmup_tokens=400_000),
            seed=config.seed,
            threads=config.threads,
            init=init,
        )
    )


def stage_target(config: TrainDemoConfig) -> None:
    shape = TARGET_SHAPES[config.target_shape]
    _pretrain(config, "target", shape, config.target_minutes, config.target_tokens, config.target_lr)


def stage_draft(config: TrainDemoConfig) -> None:
    _pretrain(config, "draft", DRAFT_SHAPES[config.draft_shape], config.draft_minutes, config.draft_tokens, config.draft_lr,
              init=config.draft_init)


def stage_generate(config: TrainDemoConfig) -> None:
    from edgespec.cloud.training.target_text import TargetTextConfig, chunks, generate_target_text

    out = config.out / "target-text"
    if chunks(out) and not config.resume:
        raise SystemExit(f"{out} already holds generated text: pass --resume to continue it, or choose another --out")
    done = generate_target_text(TargetTextConfig(
        target=config.out / "target" / "final", data=config.data_dir / "train.bin", out_dir=out,
        sequences=config.generate_sequences, minutes=config.generate_minutes, seed=config.seed, threads=config.threads,
    ))
    print(f"generate: {done:,} target-generated sequences in {out}")


def stage_distill(config: TrainDemoConfig) -> None:
    from edgespec.cloud.training.distill import DistillConfig, distill

    out = config.out / "distill"
    _guard_fresh(out / "checkpoint", config)
    from edgespec.cloud.training.target_text import chunks

    corpus = config.out / "target-text"
    corpus = corpus if chunks(corpus) else None  # without the generate stage, distill generates as it goes
    print(f"distill: generated steps {'read ' + str(corpus) if corpus else 'generate their text on the fly'}")
    report = distill(
        DistillConfig(
            target=config.out / "target" / "final",
            draft=config.out / "draft" / "final",
            data=config.data_dir / "train.bin",
            validation=config.data_dir / "validation.bin",
            out=out,
            minutes=config.distill_minutes,
            temperature=config.distill_temperature,
            generated_fraction=config.distill_generated_fraction,
            corpus=corpus,
            ce_weight=config.distill_ce_weight,
            seed=config.seed,
            threads=config.threads,
            resume=config.resume,
        )
    )
    print(f"distill: {report}")


def stage_eval(config: TrainDemoConfig) -> None:
    from edgespec.cloud.demo.evaluate import EvalConfig, evaluate_pair

    out = config.out / "eval"
    out.mkdir(parents=True, exist_ok=True)
    metrics = {}
    for label, draft in (("pretrained", config.out / "draft" / "final"), ("distilled", config.out / "distill" / "final")):
        if not checkpoint_exists(draft):
            print(f"eval: {draft} missing; skipping the {label} draft")
            continue
        result = evaluate_pair(
            EvalConfig(
                target=config.out / "target" / "final",
                draft=draft,
                data_dir=config.data_dir,
                prompts=config.data_dir / "heldout.jsonl",
                max_prompts=config.eval_prompts,
                threads=config.threads,
            )
        )
        metrics[label] = asdict(result)
        print(f"eval ({label} draft): {result.summary()}", flush=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")


def stage_export(config: TrainDemoConfig) -> None:
    from edgespec.cloud.training.export import export_draft

    export_draft(config.ship / "draft-hf", config.ship / "draft", overwrite=True)
    print(f"export: ONNX draft for the device written to {config.ship / 'draft'}")


def stage_ship(config: TrainDemoConfig) -> None:
    from edgespec.cloud.demo.ship import ship

    ship(config.out, config.ship)


RUNNERS = {
    "data": stage_data,
    "target": stage_target,
    "draft": stage_draft,
    "generate": stage_generate,
    "distill": stage_distill,
    "eval": stage_eval,
    # ship before export so the exported draft is the shipped one
    "ship": stage_ship,
    "export": stage_export,
}


def train_demo(config: TrainDemoConfig) -> None:
    (config.out).mkdir(parents=True, exist_ok=True)
    # every invocation is recorded (stages are often run one at a time), for metrics.json
    with (config.out / INVOCATIONS).open("a") as fh:
        fh.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), **asdict(config)}, default=str) + "\n")
    for stage, runner in RUNNERS.items():
        if stage in config.stages:
            _banner(stage)
            runner(config)
