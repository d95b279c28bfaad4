"""The reward, the tokenizer round trip and the content-hashed asset cache."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.verl.cpu import assets
from orchestrator.verl.cpu.reward import compute_score, score_answer
from orchestrator.verl.cpu.task import TaskSpec


def test_score_rewards_stopping_at_the_right_place():
    assert score_answer("37", "37")["score"] == pytest.approx(1.0)
    long = score_answer("37999999", "37")
    assert long["acc"] == 0 and long["score"] < 0.5
    assert score_answer("3", "37")["score"] < score_answer("37", "37")["score"]
    assert score_answer("37  ", "37")["acc"] == 0  # blanks instead of EOS earn nothing extra
    assert score_answer("", "37")["score"] == pytest.approx(0.3 / 3)


def test_compute_score_checks_data_source():
    assert compute_score("ablate_cpu/copy", "5", "5")["acc"] == 1.0
    with pytest.raises(ValueError):
        compute_score("openai/gsm8k", "5", "5")


def test_task_targets():
    assert TaskSpec("copy").target("123") == "123"
    assert TaskSpec("reverse").target("123") == "321"
    with pytest.raises(ValueError):
        TaskSpec("sort")


def test_tokenizer_round_trips_through_auto_tokenizer(tmp_path: Path):
    from transformers import AutoTokenizer

    built = assets.build(assets.AssetSpec(n_train=8, n_val=4), cache_root=tmp_path)
    again = assets.build(assets.AssetSpec(n_train=8, n_val=4), cache_root=tmp_path)
    assert built.root == again.root  # cached by content hash
    other = assets.build(assets.AssetSpec(n_train=9, n_val=4), cache_root=tmp_path)
    assert other.root != built.root
    tok = AutoTokenizer.from_pretrained(built.model_dir)
    text = "12 3=\n45"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "37"}],
                                     add_generation_prompt=True, tokenize=False)
    assert prompt == "37="
