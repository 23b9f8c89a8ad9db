"""``python -m policy import SOURCE DEST``: what ``tandem models import`` runs (:func:`policy.import_model`)."""

from __future__ import annotations

import argparse
import sys

from policy import ModelImportError, import_model, load_tokenizer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m policy", description="the policy package's tools")
    tools = parser.add_subparsers(dest="tool", required=True)
    model_import = tools.add_parser(
        "import", help="a GGUF file or a Hugging Face directory as a Tandem-ready Hugging Face directory "
        "(safetensors, config.json, tokenizer.json, the chat template), dequantized")
    model_import.add_argument("source", help="a .gguf file, or a directory with config.json and *.safetensors")
    model_import.add_argument("destination", help="the directory to write, e.g. var/models/<name>")
    model_import.add_argument(
        "--chat-template", metavar="FILE", default=None,
        help="a Jinja chat template to give the model, for one whose tokenizer has none (a base model "
        "such as Gemma 3 270M; policy/chat_templates/ holds Gemma's turn format); replaces any it has")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        destination = import_model(args.source, args.destination, chat_template=args.chat_template)
    except ModelImportError as exc:
        print(f"tandem models import: {exc}", file=sys.stderr)
        return 2
    print(f"imported {args.source} into {destination}: use it as model.hf_checkpoint and model.tokenizer")
    if load_tokenizer(str(destination)).chat_template is None:
        print(f"note: {destination} has no chat template, so runs can only render it in the byte layout it was "
              "never trained on; import it again with --chat-template FILE (policy/chat_templates/ has Gemma's)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
