from policy.byte_layout import Conversation
from policy.tokenizer import BOS_ID, EOS_ID, ByteTokenizer


def test_only_policy_turns_are_marked_as_the_models_tokens():
    tokenizer = ByteTokenizer()
    conversation = Conversation.start(tokenizer, tool_names=["calc"], prompt="2+3=?\n")
    conversation.add_policy_text("calc(2+3)")
    conversation.add_environment("=5\n")
    conversation.add_policy_tokens([ord("A"), ord(":"), ord("5"), EOS_ID], [-0.1, -0.2, -0.3, -0.4])

    header = "tools:calc\n2+3=?\n"
    expected_ids = (
        [BOS_ID] + tokenizer.encode(header) + tokenizer.encode("calc(2+3)") + [EOS_ID]
        + tokenizer.encode("=5\n") + tokenizer.encode("A:5") + [EOS_ID]
    )
    assert conversation.token_ids == expected_ids
    expected_mask = [0] * (1 + len(header)) + [1] * 10 + [0] * 3 + [1] * 4
    assert conversation.loss_mask == expected_mask
    assert conversation.behaviour_logprobs[-4:] == [-0.1, -0.2, -0.3, -0.4]
    assert all(lp == 0.0 for lp, m in zip(conversation.behaviour_logprobs, expected_mask, strict=True) if m == 0)
    assert tokenizer.decode(conversation.token_ids) == header + "calc(2+3)=5\nA:5"
