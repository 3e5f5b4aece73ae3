#!/usr/bin/env python3
"""Renders the `systemone` chat template of a clef GGUF file with Jinja2 (an implementation we did not write) and
checks it against the publisher's prompt segments in the tiny-clef fixture.

Usage: check_systemone_template.py FILE.gguf CASES.json

The GGUF metadata is read here from the format definition (not with clef's reader). For every text case of the
fixture the template gets what llama.cpp's decision server gives it: `state` (objects with their keys sorted),
`questions` in request order as {id, type, instructions, options: [{key, description}]} in encoded order (noul
true/false with the descriptions the request gives, choice by key, score by level), `sep`, `mark_question` and
`mark_option`. The output split on `sep` must equal the fixture's segment texts one for one, and the marks must
start exactly the instruction and option_json pieces.
"""
import json
import struct
import sys

import jinja2

SEP, MARK_Q, MARK_O = "<<clef:sep>>", "<<clef:question>>", "<<clef:option>>"


def read_metadata(path):
    data = open(path, "rb").read()
    if data[:4] != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file")
    pos = 8
    _, kv_count = struct.unpack_from("<QQ", data, pos)
    pos += 16
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        s = data[pos + 8 : pos + 8 + n].decode("utf-8")
        pos += 8 + n
        return s

    def value(t):
        nonlocal pos
        if t == 8:
            return string()
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            return [value(et) for _ in range(n)]
        (v,) = struct.unpack_from(scalar[t], data, pos)
        pos += struct.calcsize(scalar[t])
        return v

    meta = {}
    for _ in range(kv_count):
        key = string()
        (t,) = struct.unpack_from("<I", data, pos)
        pos += 4
        meta[key] = value(t)
    return meta


def sorted_keys(v):
    if isinstance(v, dict):
        return {k: sorted_keys(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [sorted_keys(x) for x in v]
    return v


def questions_of(request):
    out = []
    for qid, q in request["questions"].items():
        crit = q.get("criteria")
        if q["type"] == "noul":
            crit = crit or {}
            options = [{"key": k, "description": sorted_keys(crit.get(k))} for k in ("true", "false")]
        elif q["type"] == "choice":
            options = [{"key": k, "description": sorted_keys(crit[k])} for k in sorted(crit)]
        else:
            options = [{"key": str(i), "description": sorted_keys(d)} for i, d in enumerate(crit)]
        out.append({"id": qid, "type": q["type"], "instructions": sorted_keys(q.get("instructions")), "options": options})
    return out


def tojson(value, separators=None, indent=None):
    return json.dumps(value, ensure_ascii=False, separators=tuple(separators) if separators else None, indent=indent)


def main():
    meta = read_metadata(sys.argv[1])
    if meta.get("tokenizer.chat_templates") != ["systemone"]:
        raise SystemExit(f"tokenizer.chat_templates is {meta.get('tokenizer.chat_templates')!r}")
    env = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined)
    env.filters["tojson"] = tojson
    template = env.from_string(meta["tokenizer.chat_template.systemone"])
    cases = json.load(open(sys.argv[2], encoding="utf-8"))["cases"]
    checked = 0
    for case in cases:
        if "segments" not in case or any(s["role"] == "media" for s in case["segments"]):
            continue
        req = case["request"]
        try:
            questions = questions_of(req)
        except (KeyError, TypeError):
            continue  # a request the server would refuse
        # An explicit null noul description removes it in the reference; the server's data model cannot say so.
        if any(q["type"] == "noul" and None in (q.get("criteria") or {}).values() for q in req["questions"].values()):
            continue
        text = template.render(state=sorted_keys(req["state"]), questions=questions, sep=SEP,
                               mark_question=MARK_Q, mark_option=MARK_O)
        pieces = text.split(SEP)
        want = case["segments"]
        if len(pieces) != len(want):
            raise SystemExit(f"{case['name']}: {len(pieces)} pieces, fixture has {len(want)} segments")
        for piece, seg in zip(pieces, want):
            marked = {MARK_Q: "instruction", MARK_O: "option_json"}
            role = next((r for m, r in marked.items() if piece.startswith(m)), None)
            if role is not None:
                piece = piece[len(MARK_Q if role == "instruction" else MARK_O):]
            if (role or "") != (seg["role"] if seg["role"] in ("instruction", "option_json") else ""):
                raise SystemExit(f"{case['name']}: piece {piece!r} marked {role}, fixture role {seg['role']}")
            if piece != seg["text"]:
                raise SystemExit(f"{case['name']}: {seg['role']} piece {piece!r} != fixture {seg['text']!r}")
        checked += 1
        print(f"{case['name']}: {len(pieces)} pieces equal")
    if checked < 6:
        raise SystemExit(f"only {checked} cases checked")
    print(f"systemone template: {checked} cases OK")


if __name__ == "__main__":
    main()
