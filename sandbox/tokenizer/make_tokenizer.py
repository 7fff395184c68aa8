#!/usr/bin/env python3
"""Write the sandbox's local tokenizer (a TEST tokenizer, no model behind it) for the acceptance client:
a WordLevel vocabulary of N plain words ("t0000".."t1999") split on whitespace, no special tokens, no decoder
(decode joins with spaces). The sglang-stub counts tokens by whitespace, so the client's prompt_len (GSP) and the
stub's prompt_tokens agree token for token. Deterministic; stdlib only.
    sandbox/tokenizer/make_tokenizer.py DIR [N]
"""
import json
import os
import sys


def main(argv):
    out = argv[1]
    n = int(argv[2]) if len(argv) > 2 else 2000
    os.makedirs(out, exist_ok=True)
    vocab = {"t%04d" % i: i for i in range(n)}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0000"}}
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as fh:
        json.dump(tok, fh)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 10000000,
                   "clean_up_tokenization_spaces": False, "test_tokenizer": "sandbox/tokenizer/make_tokenizer.py"},
                  fh, indent=1)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as fh:
        json.dump({"model_type": "llama", "architectures": ["StubForCausalLM"], "vocab_size": n}, fh, indent=1)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
