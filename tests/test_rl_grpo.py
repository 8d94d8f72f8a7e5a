"""A real RL client: TRL's GRPOTrainer (CPU, no vLLM) on a tiny Llama compiled in phase ``rl``, where one model both
samples and trains. Inside TRL's loop, every completion's per-token log-probs from the training forward equal the
sampler's (from ``generate``'s logits) bit for bit (``examples/rl_grpo_trl.py``)."""
import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_grpo_trainer_scores_what_generate_sampled():
    from rl_grpo_trl import train

    rewards, mismatches, plan = train(steps=2, recipe="nvfp4")
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)
    assert len(mismatches) == 16 and set(mismatches) == {0.0}
    fprop = [d for d in plan.decisions if str(d.role) == "fprop" and d.fmt == "nvfp4"]
    assert fprop and all(d.input_amax is not None for d in fprop)
    assert {g[:5] for d in fprop for g in d.graphs} == {"infer", "train"}  # sampling and training graphs share them
