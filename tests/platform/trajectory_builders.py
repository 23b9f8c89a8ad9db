"""Trajectory samples as the trainer builds them: real records through trainer.trajectory_samples."""

from __future__ import annotations

import uuid

from policy.byte_layout import Conversation
from policy.tokenizer import EOS_ID, ByteTokenizer
from tandem.contracts import EpisodeTimings, ToolSchema, TrajectoryRecord, TrajectorySample
from trainer.trajectory_samples import trajectory_sample

TOKENIZER = ByteTokenizer()
CALC = ToolSchema(
    name="calc",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


def calculator_record(
    run_id: int, *, reward: float = 1.0, status: str = "ok", environment: str = "calculator",
    question: str = "What is 2+3?", expression: str = "2+3", answer: str = "5", group_id: str | None = None,
) -> TrajectoryRecord:
    """An episode that calls the calculator, reads the result and answers."""
    conversation = Conversation.start(TOKENIZER, tool_names=["calc"], prompt=question)
    call = TOKENIZER.encode(f"calc({expression})") + [EOS_ID]
    conversation.add_policy_tokens(call, [-0.5] * len(call))
    conversation.add_environment(answer)
    reply = TOKENIZER.encode(answer) + [EOS_ID]
    conversation.add_policy_tokens(reply, [-0.25] * len(reply))
    failed = status == "failed"
    return TrajectoryRecord(
        trajectory_id=uuid.uuid4().hex, run_id=run_id, group_id=group_id or f"{run_id}-0", group_size=4,
        environment=environment, policy_version=3, policy_versions=[3, 4],
        token_ids=list(conversation.token_ids), behaviour_logprobs=list(conversation.behaviour_logprobs),
        loss_mask=[0] * len(conversation.loss_mask) if failed else list(conversation.loss_mask),
        reward=0.0 if failed else reward, status=status,
        failure_reason="tool calc timed out after 30s" if failed else "", num_turns=2,
        timings=EpisodeTimings(started_at=100.0, finished_at=101.5, generation_s=1.0, environment_s=0.2),
    )


def chat_calculator_record(run_id: int, tokenizer, *, status: str = "ok", reason: str = "") -> TrajectoryRecord:
    """The same episode in a chat template (the tokenizer's), token in, token out, with its messages."""
    from environments import Tool, format_tool_call
    from policy import ChatTemplateLayout
    from tandem.contracts import ConversationMessage

    layout = ChatTemplateLayout(tokenizer)
    episode = layout.start("What is 2+3?", [Tool(name=CALC.name, description=CALC.description,
                                                  parameters=CALC.parameters, run=None)])
    call_text = format_tool_call("calc", {"expression": "2+3"}, layout.tool_call_format)
    call = tokenizer.encode(call_text) + [tokenizer.eos_id]
    layout.add_sampled(episode, call, [-0.5] * len(call), content=call_text,
                       tool_calls=[{"name": "calc", "arguments": {"expression": "2+3"}}])
    layout.add_messages(episode, [{"role": "tool", "content": "=5"}])
    reply = tokenizer.encode("2+3 = 5") + [tokenizer.eos_id]
    layout.add_sampled(episode, reply, [-0.25] * len(reply), content="2+3 = 5")
    return TrajectoryRecord(
        trajectory_id=uuid.uuid4().hex, run_id=run_id, group_id=f"{run_id}-1", group_size=4,
        environment="calculator-chat", policy_version=3, policy_versions=[3, 4],
        token_ids=episode.token_ids, behaviour_logprobs=episode.behaviour_logprobs, loss_mask=episode.loss_mask,
        reward=1.0, status=status, failure_reason=reason, num_turns=2,
        timings=EpisodeTimings(started_at=100.0, finished_at=101.5, generation_s=1.0, environment_s=0.2),
        messages=tuple(ConversationMessage(**message) for message in episode.messages),
    )


def calculator_sample(run_id: int, *, step: int = 1, why: str = "best", advantage: float | None = None,
                      **record_fields) -> TrajectorySample:
    return trajectory_sample(calculator_record(run_id, **record_fields), step=step, selected_because=why,
                             tokenizer=TOKENIZER, tools=[CALC], advantage=advantage)


def schema_1_payload(sample: TrajectorySample) -> dict:
    """``sample`` as a trainer before per-token values and groups posted it (schema 1)."""
    payload = sample.model_dump(mode="json")
    payload["schema_version"] = 1
    for field_name in ("group_size", "advantage", "token_values"):
        del payload[field_name]
    for turn in payload["turns"]:
        turn["spans"] = [{key: span[key] for key in ("text", "tokens", "trained")} for span in turn["spans"]]
    return payload


def post_body(*samples: TrajectorySample) -> dict:
    return {"samples": [sample.model_dump(mode="json") for sample in samples]}


def tool_use_record(run_id: int, *, first_turn: str) -> TrajectoryRecord:
    """An episode of the byte layout whose first policy turn calls ``calc`` (``first_turn`` "ok"), writes
    call markup that does not parse ("unparsed": the tool message says why and the episode goes on), or
    answers at once ("answer"), as workers.agent records them."""
    from environments import Tool, format_tool_call
    from policy import ByteLayout
    from tandem.contracts import ConversationMessage

    layout = ByteLayout(TOKENIZER)
    episode = layout.start("What is 2+3?", [Tool(name=CALC.name, description=CALC.description,
                                                  parameters=CALC.parameters, run=None)])

    def sampled(text: str, **calls) -> None:
        tokens = TOKENIZER.encode(text) + [EOS_ID]
        layout.add_sampled(episode, tokens, [-0.5] * len(tokens), content=text, **calls)

    if first_turn == "ok":
        sampled(format_tool_call("calc", {"expression": "2+3"}, "tandem"),
                tool_calls=[{"name": "calc", "arguments": {"expression": "2+3"}}])
        episode.note_tool_call_outcome("ok", None)
        layout.add_messages(episode, [{"role": "tool", "content": "=5"}])
    elif first_turn == "unparsed":
        sampled("<tool_call>calc(2+3")
        episode.note_tool_call_outcome("unparsed", "the call markup is not closed")
        layout.add_messages(episode, [{"role": "tool", "content": "error: the call markup is not closed"}])
    sampled("5")
    turns = sum(message["role"] == "assistant" for message in episode.messages)
    return TrajectoryRecord(
        trajectory_id=uuid.uuid4().hex, run_id=run_id, group_id=f"{run_id}-0", group_size=4,
        environment="calculator", policy_version=3, policy_versions=[3] * turns,
        token_ids=episode.token_ids, behaviour_logprobs=episode.behaviour_logprobs, loss_mask=episode.loss_mask,
        reward=1.0, status="ok", num_turns=turns,
        timings=EpisodeTimings(started_at=100.0, finished_at=101.5, generation_s=1.0, environment_s=0.2),
        messages=tuple(ConversationMessage(**message) for message in episode.messages),
    )


def tool_use_sample(run_id: int, *, first_turn: str, step: int = 1) -> TrajectorySample:
    return trajectory_sample(tool_use_record(run_id, first_turn=first_turn), step=step, selected_because="best",
                             tokenizer=TOKENIZER, tools=[CALC])


def agent_program_record(run_id: int) -> TrajectoryRecord:
    """An agent program's episode of the byte layout, through the endpoint's own bookkeeping
    (workers.agent_endpoint): it calls ``calc``, calls it again with the result, then rewrites its
    history (keeping only the second call and its result) before the answer, so the record holds two
    chains, the second with the given-back call as its context."""
    import asyncio

    from policy import ByteLayout, Completion
    from tandem.configs.rollout import SamplingConfig
    from tandem.contracts import ConversationMessage
    from workers.agent_endpoint import AgentEpisode, ChatCompletionRequest

    class ScriptedPolicy:
        sampling = SamplingConfig(max_new_tokens=32)

        def __init__(self):
            self.turns = ["calc(2+3)", "calc(5*1)", "5"]

        async def generate(self, prompt, *, session_id=None, extra_stop=()):
            tokens = TOKENIZER.encode(self.turns.pop(0)) + [EOS_ID]
            return Completion(token_ids=tokens, logprobs=[-0.5] * len(tokens), finished=True, stop_reason="eos",
                              policy_version=2, last_policy_version=2)

        def end_session(self, session_id):
            pass

    episode = AgentEpisode(policy=ScriptedPolicy(), layout=ByteLayout(TOKENIZER), tokenizer=TOKENIZER,
                           max_seq_len=1024, max_calls=4, model="tandem-run")
    tools = [{"type": "function", "function": {"name": CALC.name, "parameters": CALC.parameters}}]
    user = {"role": "user", "content": "What is 2+3?"}

    async def ask(messages):
        reply = await episode.complete(ChatCompletionRequest.model_validate({"messages": messages, "tools": tools}))
        return reply["choices"][0]["message"]

    async def play():
        first = await ask([user])
        result = {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "5"}
        second = await ask([user, first, result])
        again = {"role": "tool", "tool_call_id": second["tool_calls"][0]["id"], "content": "5"}
        await ask([user, second, again])

    asyncio.run(play())
    played = episode.finish()
    tokens = played.tokens
    return TrajectoryRecord(
        run_id=run_id, group_id=f"{run_id}-0", group_size=1, environment="react", policy_version=2,
        policy_versions=played.policy_versions, token_ids=tokens.token_ids, behaviour_logprobs=tokens.behaviour_logprobs,
        loss_mask=tokens.loss_mask, reward=1.0, num_turns=len(played.calls),
        timings=EpisodeTimings(started_at=0.0, finished_at=1.0, generation_s=0.1, environment_s=0.5),
        messages=tuple(ConversationMessage(**message) for message in tokens.messages),
        segment_starts=tuple(tokens.segment_starts), offered_tools=("calc",), agent_calls=played.calls)


def agent_program_sample(run_id: int, *, step: int = 1) -> TrajectorySample:
    return trajectory_sample(agent_program_record(run_id), step=step, selected_because="best", tokenizer=TOKENIZER,
                             tools=[CALC])
