#!/usr/bin/env python3
"""Write tools/golive/questions.json: the quality gate's default question set (issue 37; docs/go-live-tuning.md).

    python3 tools/golive/make_questions.py > tools/golive/questions.json

Five task types of 20 items each (the seed, ../shared/seeds/001_*.txt section 3.3, names math, code, long-context
extraction, classification and table understanding as the types to split by). Every item is written from its own
numbers here, so each reference and checkable answer is computed, not guessed; a fixed seed makes the file the same
on every run (tests/unit/test_quality_gate.py checks that the committed file is what this script prints).
Item: {id, task_type, prompt, reference, check} with check {"kind": "number"|"label", "answer"} or null (ROUGE-L
only). The thresholds are the gate's defaults; a deployment may keep its own question set in the same format.
"""
import json
import random

SEED = 37
PER_TYPE = 20
HOSTS = ["b3%02d" % i for i in range(1, 13)]
POSITIVE = ["the rollout was smooth and latency dropped, great work", "support answered fast and fixed it",
            "throughput doubled after the upgrade and everyone is happy", "clean install, the docs were clear",
            "excellent stability over the whole week"]
NEGATIVE = ["the upgrade broke our dashboards and nobody answered", "latency doubled and requests kept failing",
            "a waste of a weekend, the install crashed twice", "terrible docs and a confusing error",
            "the service fell over every night this week"]
TOPICS = [("rack", "power"), ("switch", "firmware"), ("GPU", "clock"), ("NIC", "link"), ("disk", "latency")]


def arithmetic(rng, i):
    a, b, c = rng.randint(20, 90), rng.randint(5, 40), rng.randint(1, 19)
    return {"prompt": "A warehouse holds %d boxes. %d more arrive and %d are shipped out. How many boxes does it "
                      "hold now? Reply with one short sentence that states the number." % (a, b, c),
            "reference": "It holds %d boxes now." % (a + b - c), "check": {"kind": "number", "answer": a + b - c}}


def table_qa(rng, i):
    hosts = rng.sample(HOSTS, 4)
    temps = [rng.randint(55, 95) for _ in hosts]
    rows = "\n".join("| %s | 8 | %d |" % (h, t) for h, t in zip(hosts, temps))
    k = rng.randrange(4)
    return {"prompt": "| host | GPUs | GPU temperature C |\n|---|---|---|\n%s\n\nWhat GPU temperature does host %s "
                      "report in this table? Reply with one short sentence that states the number." % (rows, hosts[k]),
            "reference": "Host %s reports %d C." % (hosts[k], temps[k]), "check": {"kind": "number",
                                                                                    "answer": temps[k]}}


def extraction(rng, i):
    ticket = "INC-%05d" % rng.randint(10000, 99999)
    day = "2026-%02d-%02d" % (rng.randint(1, 12), rng.randint(1, 28))
    rack = rng.randint(1, 40)
    return {"prompt": "Message: \"Hi team, ticket %s covers the NIC flap on rack %d seen on %s; please review.\" "
                      "Which ticket number does the message name? Reply with the ticket number only." % (ticket, rack,
                                                                                                        day),
            "reference": ticket, "check": {"kind": "label", "answer": ticket}}


def classification(rng, i):
    label = "positive" if i % 2 == 0 else "negative"
    text = rng.choice(POSITIVE if label == "positive" else NEGATIVE)
    return {"prompt": "Review: \"%s.\" Is the sentiment of this review positive or negative? Reply with one word."
                      % text, "reference": label, "check": {"kind": "label", "answer": label}}


def summary(rng, i):
    thing, what = rng.choice(TOPICS)
    n = rng.randint(2, 9)
    h = rng.choice(HOSTS)
    return {"prompt": "Summarize in one sentence: \"On host %s the %s %s was checked after the alert. %d %ss showed "
                      "a fault and were replaced during the night window. Monitoring shows normal values since.\""
                      % (h, thing, what, n, thing),
            "reference": "%d faulty %ss on host %s were replaced overnight and %s %s is normal again." % (
                n, thing, h, thing, what), "check": None}


TYPES = [("math", arithmetic), ("table_qa", table_qa), ("extraction", extraction),
         ("classification", classification), ("summary", summary)]


def build():
    rng = random.Random(SEED)
    items = []
    for name, make in TYPES:
        for i in range(PER_TYPE):
            item = make(rng, i)
            items.append(dict({"id": "%s-%02d" % (name, i + 1), "task_type": name}, **item))
    return {"_source": "tools/golive/make_questions.py (seed %d); task types after ../shared/seeds/001_*.txt "
                       "section 3.3" % SEED,
            "settings": {"temperature": 0, "seed": 42, "max_tokens": 256},
            "thresholds": {"default": {"max_rouge_drop_points": 3.0, "max_accuracy_drop_points": 3.0},
                           "types": {},
                           "mean": {"max_rouge_drop_points": 2.0, "max_accuracy_drop_points": 2.0}},
            "items": items}


if __name__ == "__main__":
    print(json.dumps(build(), indent=1))
