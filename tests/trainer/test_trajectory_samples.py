"""Which trajectories the trainer sends to the browser, and how their tokens become turns and spans."""

from __future__ import annotations

import json

import pytest

from policy.byte_layout import Conversation
from policy.tokenizer import BOS_ID, EOS_ID, ByteTokenizer
from tandem.contracts import EpisodeTimings, ToolSchema, TrajectoryRecord, TrajectorySample
from tandem.runtime.local_ports import free_local_port
from trainer.platform_client import PlatformClient
from trainer.trajectory_samples import (
    TrajectorySampleBuffer,
    sample_posts,
    select_samples,
    trajectory_sample,
)

TOKENIZER = ByteTokenizer()
CALC = ToolSchema(
    name="calc",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


def _record(*, reward: float = 1.0, status: str = "ok", conversation: Conversation | None = None,
            policy_versions=(3, 4), trajectory_id: str | None = None) -> TrajectoryRecord:
    conversation = _calculator_conversation() if conversation is None else conversation
    loss_mask = list(conversation.loss_mask)
    if status == "failed":
        loss_mask = [0] * len(loss_mask)  # as producers send failed episodes
    fields = {"trajectory_id": trajectory_id} if trajectory_id else {}
    return TrajectoryRecord(
        **fields, run_id=7, group_id="7-0", group_size=4, environment="calculator",
        policy_version=min(policy_versions, default=0), policy_versions=list(policy_versions),
        token_ids=list(conversation.token_ids), behaviour_logprobs=list(conversation.behaviour_logprobs),
        loss_mask=loss_mask, reward=reward, status=status,
        failure_reason="step timed out after 30s" if status == "failed" else "",
        num_turns=len(policy_versions),
        timings=EpisodeTimings(started_at=100.0, finished_at=101.5, generation_s=1.0, environment_s=0.2),
    )


def _calculator_conversation() -> Conversation:
    """BOS "tools:calc\\nWhat is 2+3?" | "calc(2+3)" EOS | "5" | "5" EOS."""
    conversation = Conversation.start(TOKENIZER, tool_names=["calc"], prompt="What is 2+3?")
    call = TOKENIZER.encode("calc(2+3)") + [EOS_ID]
    conversation.add_policy_tokens(call, [-0.5] * len(call))
    conversation.add_environment("5")
    answer = TOKENIZER.encode("5") + [EOS_ID]
    conversation.add_policy_tokens(answer, [-0.25] * len(answer))
    return conversation


def test_a_calculator_episode_becomes_turns_with_its_tool_call_and_trained_spans():
    record = _record()

    sample = trajectory_sample(record, step=12, selected_because="best", tokenizer=TOKENIZER, tools=[CALC])

    # By hand: BOS + 11 bytes of tool header + 12 of prompt (masked), 9 bytes + EOS (trained), "5" (masked), "5" + EOS (trained).
    assert [(turn.role, turn.text, turn.policy_version) for turn in sample.turns] == [
        ("prompt", "tools:calc\nWhat is 2+3?", None),
        ("policy", "calc(2+3)", 3),
        ("tool", "5", None),
        ("policy", "5", 4),
    ]
    assert [[(span.text, span.tokens, span.trained) for span in turn.spans] for turn in sample.turns] == [
        [("⟨bos⟩tools:calc\nWhat is 2+3?", 1 + 11 + 12, False)],
        [("calc(2+3)⟨eos⟩", 10, True)],
        [("5", 1, False)],
        [("5⟨eos⟩", 2, True)],
    ]
    assert sample.turns[1].tool_calls[0].name == "calc"
    assert sample.turns[1].tool_calls[0].arguments == {"expression": "2+3"}
    assert sample.turns[3].tool_calls == ()
    assert (sample.num_tokens, sample.trained_tokens) == (24 + 10 + 1 + 2, 10 + 2)
    assert sample.step == 12 and sample.policy_versions == [3, 4] and sample.reward == 1.0
    # It survives the trip to the platform as JSON.
    assert TrajectorySample.model_validate_json(sample.model_dump_json()) == sample


def test_an_answer_without_a_tool_call_is_followed_by_an_environment_turn():
    conversation = Conversation.start(TOKENIZER, tool_names=[], prompt="Say hi")
    turn = TOKENIZER.encode("hello") + [EOS_ID]
    conversation.add_policy_tokens(turn, [-1.0] * len(turn))
    conversation.add_environment("Louder.")
    record = _record(conversation=conversation, policy_versions=(0,))

    sample = trajectory_sample(record, step=1, selected_because="worst", tokenizer=TOKENIZER, tools=[CALC])

    assert [turn.role for turn in sample.turns] == ["prompt", "policy", "environment"]
    assert sample.turns[2].text == "Louder." and sample.turns[2].policy_version is None


def test_a_failed_episode_keeps_its_turns_with_every_token_masked():
    record = _record(status="failed", reward=0.0)

    sample = trajectory_sample(record, step=2, selected_because="failed", tokenizer=TOKENIZER, tools=[CALC])

    assert [turn.role for turn in sample.turns] == ["prompt", "policy", "tool", "policy"]
    assert all(not span.trained for turn in sample.turns for span in turn.spans)
    assert sample.trained_tokens == 0 and sample.num_tokens == 37
    assert sample.failure_reason == "step timed out after 30s"


def test_an_episode_that_failed_before_its_first_token_has_no_turns():
    # A circuit breaker that was open fails the episode before reset: no tokens at all.
    record = _record(conversation=Conversation(TOKENIZER), status="failed", reward=0.0, policy_versions=())

    sample = trajectory_sample(record, step=2, selected_because="failed", tokenizer=TOKENIZER)

    assert sample.turns == () and sample.num_tokens == 0 and sample.trained_tokens == 0


def test_two_policy_turns_with_nothing_between_are_split_at_eos():
    conversation = Conversation.start(TOKENIZER, tool_names=["calc"], prompt="Q")
    for text in ("calc(1)", "calc(2)"):
        tokens = TOKENIZER.encode(text) + [EOS_ID]
        conversation.add_policy_tokens(tokens, [-0.1] * len(tokens))
        conversation.add_environment("")  # a tool that answered nothing
    record = _record(conversation=conversation, policy_versions=(5, 6))

    sample = trajectory_sample(record, step=1, selected_because="best", tokenizer=TOKENIZER, tools=[CALC])

    assert [(turn.role, turn.text, turn.policy_version) for turn in sample.turns] == [
        ("prompt", "tools:calc\nQ", None), ("policy", "calc(1)", 5), ("policy", "calc(2)", 6),
    ]
    assert conversation.token_ids[0] == BOS_ID


def test_the_best_and_worst_rewards_and_the_failures_are_selected_once_each():
    rewards = [0.5, 1.0, 0.0, 1.0, 0.25]
    records = [_record(reward=reward, trajectory_id=f"ok{index}") for index, reward in enumerate(rewards)]
    records += [_record(status="failed", reward=0.0, trajectory_id=f"failed{index}") for index in range(3)]

    chosen = select_samples(records, per_step=2)

    # The first of the two 1.0 rewards (stream order breaks ties); failures up to per_step.
    assert [(why, record.trajectory_id) for why, record in chosen] == [
        ("best", "ok1"), ("worst", "ok2"), ("failed", "failed0"), ("failed", "failed1"),
    ]
    assert [record.trajectory_id for _, record in select_samples(records, per_step=3)] == [
        "ok1", "ok3", "ok2", "failed0", "failed1", "failed2",
    ]
    assert select_samples(records, per_step=0) == []
    # A lone episode is both the best and the worst: sent once.
    assert [why for why, _ in select_samples(records[:1], per_step=2)] == ["best"]


def test_a_platform_that_does_not_answer_loses_the_samples_and_not_the_step():
    # Nothing listens on this port: the post fails at once, and flush must not raise.
    client = PlatformClient(f"http://127.0.0.1:{free_local_port()}", "token", trainer_name="w:1", retries=0)
    buffer = TrajectorySampleBuffer(client, 7, TOKENIZER, per_step=2, tools=[CALC])
    buffer.add_step(step=1, records=[_record(reward=1.0), _record(reward=0.0)])
    assert len(buffer.pending) == 2

    buffer.flush()

    assert buffer.pending == [] and buffer.lost == 2 and buffer.posted == 0
    client.close()


@pytest.mark.parametrize("per_step", [1, 2])
def test_the_run_config_field_bounds_the_samples_per_step(per_step):
    from tandem.configs.run import RunConfig

    assert RunConfig().trajectory_samples_per_step == 2
    records = [_record(reward=float(index), trajectory_id=f"r{index}") for index in range(6)]
    assert len(select_samples(records, per_step=per_step)) == per_step


def test_an_evaluation_of_another_environment_is_read_with_that_environments_tools():
    # The run's own environment has no calculator: its tools would read "calc(2+3)" as plain text.
    buffer = TrajectorySampleBuffer(None, 7, TOKENIZER, per_step=1, tools=[ToolSchema(name="guess", parameters={"type": "object"})])
    buffer.add_step(step=3, records=[_record()], purpose="evaluation")
    buffer.add_step(step=3, records=[_record()], purpose="evaluation", tools=[CALC])

    own, other = buffer.pending
    assert own.turns[1].tool_calls == () and own.turns[2].role == "environment"
    assert [call.name for call in other.turns[1].tool_calls] == ["calc"] and other.turns[2].role == "tool"


def _group(group_id: str, rewards, *, failed: int = 0) -> list[TrajectoryRecord]:
    members = [_record(reward=reward, trajectory_id=f"{group_id}-{index}") for index, reward in enumerate(rewards)]
    members += [_record(status="failed", reward=0.0, trajectory_id=f"{group_id}-failed{index}")
                for index in range(failed)]
    return [member.model_copy(update={"group_id": group_id, "group_size": len(members)}) for member in members]


def test_whole_groups_are_sampled_widest_reward_range_first_failed_members_included():
    flat = _group("flat", [1.0, 1.0, 1.0])
    narrow = _group("narrow", [0.25, 0.5])
    wide = _group("wide", [0.0, 1.0], failed=1)
    records = flat + narrow + wide

    chosen = select_samples(records, per_step=0, groups_per_step=2)

    assert [(why, record.trajectory_id) for why, record in chosen] == [
        ("group", "wide-0"), ("group", "wide-1"), ("group", "wide-failed0"),
        ("group", "narrow-0"), ("group", "narrow-1"),
    ]
    # The best and worst episodes come on top, each record once: the best is in no sampled group.
    with_extremes = select_samples(records, per_step=2, groups_per_step=1)
    assert [(why, record.trajectory_id) for why, record in with_extremes] == [
        ("group", "wide-0"), ("group", "wide-1"), ("group", "wide-failed0"), ("best", "flat-0"),
    ]


def test_every_token_carries_its_text_its_behaviour_logprob_and_its_episodes_advantage():
    record = _record()

    sample = trajectory_sample(record, step=2, selected_because="group", tokenizer=TOKENIZER, tools=[CALC],
                               advantage=0.75)

    spans = [span for turn in sample.turns for span in turn.spans]
    assert sample.token_values == "included" and sample.advantage == 0.75 and sample.group_size == 4
    # By hand, span by span: the prompt (24 tokens, logprob 0: not the policy's), the call (10 at -0.5),
    # the tool's "5", the answer (2 at -0.25); the advantage on trained tokens only.
    assert [span.logprobs for span in spans] == [(0.0,) * 24, (-0.5,) * 10, (0.0,), (-0.25,) * 2]
    assert [span.advantages for span in spans] == [(0.0,) * 24, (0.75,) * 10, (0.0,), (0.75,) * 2]
    assert spans[1].pieces == tuple("calc(2+3)") + ("⟨eos⟩",)
    assert all("".join(span.pieces) == span.text for span in spans)
    flat_logprobs = [logprob for span in spans for logprob in span.logprobs]
    assert flat_logprobs == list(record.behaviour_logprobs)
    assert TrajectorySample.model_validate_json(sample.model_dump_json()) == sample


def test_an_episode_without_a_per_episode_advantage_has_logprobs_but_no_advantages():
    sample = trajectory_sample(_record(), step=2, selected_because="best", tokenizer=TOKENIZER, tools=[CALC])

    spans = [span for turn in sample.turns for span in turn.spans]
    assert sample.advantage is None and all(span.advantages == () for span in spans)
    assert all(len(span.logprobs) == span.tokens for span in spans)


def test_a_sample_too_large_for_its_token_values_goes_without_them_and_says_so():
    record = _record()
    full = trajectory_sample(record, step=2, selected_because="best", tokenizer=TOKENIZER, tools=[CALC])

    small = trajectory_sample(record, step=2, selected_because="best", tokenizer=TOKENIZER, tools=[CALC],
                              max_bytes=len(full.model_dump_json()) - 1)

    assert small.token_values == "left_out_for_size"
    assert all(span.pieces == span.logprobs == span.advantages == () for turn in small.turns for span in turn.spans)
    assert [turn.text for turn in small.turns] == [turn.text for turn in full.turns]
    assert len(small.model_dump_json()) < len(full.model_dump_json())


def test_posts_of_samples_stay_under_the_byte_limit_and_a_sample_too_large_for_any_is_left_out():
    samples = [trajectory_sample(_record(trajectory_id=f"t{index}"), step=1, selected_because="group",
                                 tokenizer=TOKENIZER, tools=[CALC]) for index in range(5)]
    one = len(json.dumps(samples[0].model_dump(mode="json")))

    posts, left_out = sample_posts(samples, max_bytes=2 * one + 200)

    assert [[sample.trajectory_id for sample in post] for post in posts] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert left_out == 0
    for post in posts:
        body = json.dumps({"samples": [sample.model_dump(mode="json") for sample in post]})
        assert len(body) <= 2 * one + 200
    assert sample_posts(samples, max_bytes=one // 2) == ([], 5)
    assert [len(post) for post in sample_posts(samples, max_samples=2)[0]] == [2, 2, 1]


def test_a_buffer_sends_the_advantages_it_is_given_with_whole_groups():
    buffer = TrajectorySampleBuffer(None, 7, TOKENIZER, per_step=0, groups_per_step=1, tools=[CALC])
    group = _group("g", [0.0, 1.0], failed=1)

    buffer.add_step(step=5, records=group, advantages={"g-0": -1.0, "g-1": 1.0})

    assert [(sample.trajectory_id, sample.advantage, sample.selected_because) for sample in buffer.pending] == [
        ("g-0", -1.0, "group"), ("g-1", 1.0, "group"), ("g-failed0", None, "group"),
    ]


def test_a_sample_stored_before_per_token_values_reads_as_not_recorded():
    stored = trajectory_sample(_record(), step=1, selected_because="best", tokenizer=TOKENIZER,
                               tools=[CALC]).model_dump(mode="json")
    stored["schema_version"] = 1
    for field_name in ("group_size", "advantage", "token_values"):
        del stored[field_name]
    for turn in stored["turns"]:
        turn["spans"] = [{key: span[key] for key in ("text", "tokens", "trained")} for span in turn["spans"]]

    sample = TrajectorySample.model_validate(stored)

    assert sample.schema_version == 2 and sample.token_values == "not_recorded" and sample.advantage is None
