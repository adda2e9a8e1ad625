"""_gate: what makes an answer degenerate, how a configuration is judged against the reference, the fallback order."""

from __future__ import annotations

import math

import pytest

from ansible_collections.gpubox.inference.plugins.module_utils import _gate, _words


def reply(text: str, tokens: list[str] | None = None, logprobs: list[float] | None = None) -> dict:
    tokens = text.split() if tokens is None else tokens
    return {"text": text, "tokens": tokens, "logprobs": [-0.5] * len(tokens) if logprobs is None else logprobs}


SOUND = reply(" Paris, the largest city of France and its capital")


# ------------------------------------------------------------ one answer


def test_a_varied_answer_is_sound():
    assert _gate.degenerate(SOUND) is None


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (reply(""), "gate.empty"),
        (reply("  \n ", tokens=[" ", "\n"]), "gate.empty"),
        (reply("!!!!!!!!!!!!!!!!", tokens=["!"] * 16), "gate.bang_run"),
        (reply("!!!", tokens=["!!!"]), "gate.bang_run"),
        (reply("Paris!!!!!!!!!!!!", tokens=["Paris", "!!!!", "!!!!", "!!!!"]), "gate.bang_run"),
        (reply("\ufffd" * 10, tokens=["\ufffd"] * 10), "gate.replacement"),
        (reply(" the the the the the cat the", tokens=["the"] * 6 + ["cat", "the"]), "gate.repeated"),
        (reply(" Paris is", logprobs=[float("nan"), -0.1]), "gate.bad_logprob"),
        (reply(" Paris is", logprobs=[-0.1, -math.inf]), "gate.bad_logprob"),
    ],
)
def test_what_a_broken_all_reduce_answers_is_degenerate(bad, code):
    assert _gate.degenerate(bad)["code"] == code


def test_a_repeated_token_is_named_with_its_share():
    finding = _gate.degenerate(reply("x", tokens=["a"] * 7 + ["b"] * 3))
    assert finding == {"code": "gate.repeated", "token": "a", "count": 7, "tokens": 10}
    assert _words.explain(finding) == "one token ('a') is 7 of its 10 tokens"


def test_a_short_answer_or_a_share_at_the_limit_is_not_called_repeated():
    assert _gate.degenerate(reply("yes yes yes", tokens=["yes"] * 3)) is None
    assert _gate.degenerate(reply("x", tokens=["a"] * 6 + list("bcde"))) is None  # 0.6 is not more than 0.6


def test_a_null_logprob_is_not_a_bad_one():
    """vLLM sends null for a token it has no logprob for; only NaN and infinity are broken."""
    assert _gate.degenerate(reply(" Paris is", logprobs=[None, -0.2])) is None


def test_the_answer_is_read_from_vllms_completion():
    payload = {
        "choices": [
            {
                "text": " five six",
                "logprobs": {"tokens": ["five", "six"], "token_logprobs": [-0.01, -0.02], "top_logprobs": [{}, {}]},
                "finish_reason": "length",
            }
        ]
    }
    assert _gate.answer(payload) == {"text": " five six", "tokens": ["five", "six"], "logprobs": [-0.01, -0.02]}
    assert _gate.answer({"choices": [{"text": None, "logprobs": None}]}) == {"text": "", "tokens": [], "logprobs": []}


def test_the_request_is_greedy_and_asks_for_logprobs():
    body = _gate.request_body("tiny", "The capital of France is", 16, 0)
    assert body == {
        "model": "tiny",
        "prompt": "The capital of France is",
        "max_tokens": 16,
        "temperature": 0,
        "seed": 0,
        "logprobs": 1,
        "stream": False,
    }


# ------------------------------------------------------------ against the reference


def answers(count: int, differing: int = 0, at: int = 0) -> tuple[list[dict], list[dict]]:
    """A reference of ``count`` answers, and replies of which the last ``differing`` diverge at token ``at``."""
    reference = [reply(" ".join(f"w{p}_{t}" for t in range(16))) for p in range(count)]
    replies = []
    for index, want in enumerate(reference):
        tokens = list(want["tokens"])
        if index >= count - differing:
            tokens[at:] = [f"x{t}" for t in range(at, 16)]
        replies.append(reply(" ".join(tokens)))
    return reference, replies


PROMPTS = [f"prompt {i}" for i in range(16)]


def test_replies_that_agree_pass():
    reference, replies = answers(16)
    verdict = _gate.judge(PROMPTS, replies, reference, {})
    assert verdict["passed"]
    assert verdict["agreement"] == {
        "agreeing": 16,
        "prompts": 16,
        "share": 1.0,
        "tokens": 8,
        "min_share": 0.875,
        "disagreeing": [],
    }
    assert verdict["evidence"] == []


def test_drift_after_the_compared_tokens_is_not_disagreement():
    """Tensor parallelism reorders sums: answers may part late, as they may between any two builds."""
    reference, replies = answers(16, differing=16, at=8)
    assert _gate.judge(PROMPTS, replies, reference, {})["passed"]


@pytest.mark.parametrize(("differing", "passed"), [(2, True), (3, False), (16, False)])
def test_nearly_all_prompts_must_agree(differing, passed):
    """14 of 16 (0.875) is the default bar; 13 of 16 fails."""
    reference, replies = answers(16, differing=differing, at=3)
    verdict = _gate.judge(PROMPTS, replies, reference, {})
    assert verdict["passed"] is passed
    assert verdict["agreement"]["disagreeing"] == list(range(16 - differing, 16))


def test_a_failed_verdict_carries_the_evidence():
    reference, replies = answers(16, differing=16, at=0)
    verdict = _gate.judge(PROMPTS, replies, reference, {"agree_tokens": 4, "min_agreement": 0.5})
    assert not verdict["passed"]
    assert len(verdict["evidence"]) == 3
    assert verdict["evidence"][0] == {"prompt": "prompt 0", "expected": reference[0]["text"], "received": replies[0]["text"]}


def test_one_degenerate_reply_fails_even_when_the_rest_agree():
    _reference, replies = answers(16)
    replies[5] = reply("!!!!!!!!!!!!!!!!", tokens=["!"] * 16)
    verdict = _gate.judge(PROMPTS, replies, None, {})
    assert not verdict["passed"]
    assert verdict["degenerate"] == [{"prompt": 5, "code": "gate.bang_run"}]
    assert verdict["evidence"] == [{"prompt": "prompt 5", "expected": None, "received": "!!!!!!!!!!!!!!!!"}]
    assert verdict["agreement"] is None


def test_an_answer_that_stops_early_agrees_up_to_its_end():
    """A model that emits its end token after 3 tokens in both configurations agrees."""
    assert _gate.agrees(["a", "b", "c"], ["a", "b", "c"], 8)
    assert not _gate.agrees(["a", "b", "c", "d"], ["a", "b"], 8)
    assert not _gate.agrees(["a", "b"], [], 8)


def test_a_reference_for_other_prompts_is_refused():
    reference, replies = answers(4)
    with pytest.raises(ValueError, match="3 replies for a reference of 4 prompts"):
        _gate.judge(PROMPTS, replies[:3], reference, {})


def test_the_key_changes_with_the_gpus_the_model_and_the_image():
    base = _gate.key("fp1", "org/model", "abc123", "vllm/vllm-openai:v0.32.0")
    assert base == "fp1|org/model|abc123|vllm/vllm-openai:v0.32.0"
    assert _gate.key("fp2", "org/model", "abc123", "vllm/vllm-openai:v0.32.0") != base
    assert _gate.key("fp1", "org/model", "def456", "vllm/vllm-openai:v0.32.0") != base
    assert _gate.key("fp1", "org/model", "abc123", "vllm/vllm-openai:v0.33.0") != base
    assert _gate.key(None, "/srv/models/tiny", None, "img:1") == "no-gpu|/srv/models/tiny|local|img:1"


# ------------------------------------------------------------ the fallback sequence

STEPS = [{"name": "as_planned"}, {"name": "no_custom_all_reduce"}, {"name": "no_p2p"}]
COMPARED = [{"name": "as_planned", "compare": True}, {"name": "no_custom_all_reduce", "compare": True}, {"name": "no_p2p"}]


def test_the_steps_are_tried_in_order_until_one_passes():
    assert _gate.next_step(STEPS, {}) == "as_planned"
    assert _gate.next_step(STEPS, {"as_planned": {"passed": False}}) == "no_custom_all_reduce"
    failed_twice = {"as_planned": {"passed": False}, "no_custom_all_reduce": {"passed": False}}
    assert _gate.next_step(STEPS, failed_twice) == "no_p2p"
    assert _gate.next_step(STEPS, {**failed_twice, "no_p2p": {"passed": False}}) is None
    assert _gate.choose(STEPS, {**failed_twice, "no_p2p": {"passed": False}}) is None
    assert _gate.next_step(STEPS, {"as_planned": {"passed": True}}) is None


def test_what_is_kept_and_why():
    assert _gate.choose(STEPS, {"as_planned": {"passed": True}}) == {"step": "as_planned", "code": "gate.passed"}
    failed_twice = {"as_planned": {"passed": False}, "no_custom_all_reduce": {"passed": False}, "no_p2p": {"passed": True}}
    chosen = _gate.choose(STEPS, failed_twice)
    assert chosen == {"step": "no_p2p", "code": "gate.fallback", "failed": ["as_planned", "no_custom_all_reduce"]}
    assert _words.explain(chosen) == (
        "the correctness gate failed with as planned, then custom all-reduce off (--disable-custom-all-reduce) "
        "and passed with P2P off (NCCL_P2P_DISABLE=1, custom all-reduce off)"
    )


def test_on_consumer_gpus_custom_all_reduce_must_also_be_faster():
    assert _gate.next_step(COMPARED, {"as_planned": {"passed": True, "tokens_per_s": 900.0}}) == "no_custom_all_reduce"
    slower = {
        "as_planned": {"passed": True, "tokens_per_s": 900.0},
        "no_custom_all_reduce": {"passed": True, "tokens_per_s": 950.0},
    }
    assert _gate.next_step(COMPARED, slower) is None
    chosen = _gate.choose(COMPARED, slower)
    assert chosen["step"] == "no_custom_all_reduce"
    assert (chosen["kept_tokens_per_s"], chosen["other_tokens_per_s"]) == (950.0, 900.0)
    faster = {**slower, "as_planned": {"passed": True, "tokens_per_s": 1000.0}}
    assert _gate.choose(COMPARED, faster)["step"] == "as_planned"
    assert _words.explain(_gate.choose(COMPARED, faster)) == (
        "the correctness gate passed with both; as planned measured 1000 tokens/s against 950 with "
        "custom all-reduce off (--disable-custom-all-reduce), so it is kept"
    )
    tie = {**slower, "as_planned": {"passed": True, "tokens_per_s": 950.0}}
    assert _gate.choose(COMPARED, tie)["step"] == "no_custom_all_reduce"


def test_custom_all_reduce_that_failed_is_not_measured_against():
    results = {"as_planned": {"passed": False}, "no_custom_all_reduce": {"passed": True, "tokens_per_s": 950.0}}
    assert _gate.next_step(COMPARED, results) is None
    assert _gate.choose(COMPARED, results) == {"step": "no_custom_all_reduce", "code": "gate.fallback", "failed": ["as_planned"]}
