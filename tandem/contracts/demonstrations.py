"""The demonstrations of one SFT step, made by a producer for the trainer to render and train on.

The trainer never imports environment code: it asks the producers for a
step's demonstrations (``DEMONSTRATIONS_TASK_NAME``, with a ``request_id`` of
its own), and a producer appends a :class:`DemonstrationBatch` to the run's
:func:`~tandem.contracts.keys.demonstration_stream`. The batch holds chat
messages, not tokens: the trainer renders them with its prompt layout, as
producers render live episodes, so the tokens it trains on are the model's own.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tandem.contracts.schema import StreamRecord
from tandem.contracts.trajectories import MessageRole, MessageToolCall

#: Longest error reason a batch carries: it becomes the run's failure reason.
DEMONSTRATION_ERROR_CHARS = 2000


class DemonstrationMessage(BaseModel):
    """One message of a demonstration, as ``environments.demonstration_messages`` writes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: MessageRole
    content: str
    tool_calls: tuple[MessageToolCall, ...] = Field(
        (), description="The call an assistant message makes, already written in `content` in the run's format."
    )


class DemonstrationBatch(StreamRecord):
    """The answer to one request for an SFT step's demonstrations, appended to :func:`demonstration_stream`.

    ``error`` set: the producer could not make them (the environment was refused
    by the operator's allow-list, failed to load, or raised); the trainer fails
    the run with it. No demonstrations and no error: the environment has none,
    and the trainer skips SFT.
    """

    run_id: int
    step: int = Field(ge=0, description="The SFT step (0-based) the demonstrations are for.")
    request_id: str = Field(description="The trainer's id of the request answered; it ignores answers of others.")
    messages: list[list[DemonstrationMessage]] = Field(
        default_factory=list, description="Each demonstration as chat messages, the prompt first."
    )
    error: str = Field("", max_length=DEMONSTRATION_ERROR_CHARS,
                       description="Why there are no demonstrations; empty when the producer made them.")
