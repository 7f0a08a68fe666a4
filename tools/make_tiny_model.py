"""Write a tiny random GPT-OSS checkpoint (real MXFP4 layout, harmony tokenizer) to try the engine.

    python tools/make_tiny_model.py /tmp/tiny-gpt-oss
    moechat generate /tmp/tiny-gpt-oss --chat --prompt "Hello" --gpu-budget 65M --max-new-tokens 32

Its weights are random, so its words are too; it exists to exercise loading, offloading and the CLI.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.tiny_gpt_oss import write_tiny_gpt_oss
from tests.fixtures.tiny_tokenizer import write_harmony_tokenizer


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tools/make_tiny_model.py OUTPUT_FOLDER")
    folder = write_tiny_gpt_oss(Path(sys.argv[1]))
    write_harmony_tokenizer(folder)
    print(f"wrote a tiny GPT-OSS model to {folder}")


if __name__ == "__main__":
    main()
