#!/usr/bin/env python3
"""clef eval against computations that do not use clef's code (Python 3 standard library only).

1. The tiny fixture's answered text cases with expectations set to the golden argmax: accuracy 100 %; set to the
   golden argmin: 0 %. Log loss, Brier score, ECE and the Wilson interval equal an independent computation from
   the golden float64 probabilities (tests/data/tiny-clef/cases.json), overall and per question type.
2. --compare against the fixture's own Q8_0 GGUF (clef convert --type q8_0): agreement, mean and max |dp| and the
   paired counts equal what the two models' `clef batch` responses give question by question.
3. The HTML report (--report, with --compare and --fit-temperature) opens in headless Chromium with no console
   message, has a reliability diagram per question type, and its screenshot shows the diagram's bars.

Usage: check_eval.py CLEF_BINARY MODEL_DIR WORK_DIR [CHROMIUM]
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import zlib

CLEF, MODEL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
CHROMIUM = sys.argv[4] if len(sys.argv) > 4 and not sys.argv[4].endswith("NOTFOUND") else shutil.which("chromium")
TYPES = ("noul", "choice", "score")
TOL = 2e-5  # float32 engine probabilities against float64 goldens
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def near(a, b, tol, what):
    check(a is not None and b is not None and abs(a - b) <= tol, f"{what}: {a} vs {b}")


def run(*args):
    return subprocess.run([CLEF, *args], check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout


# ---- the golden cases as labelled lines ----

def answer_label(qtype, option_id):
    return {"noul": lambda: option_id == "true", "choice": lambda: option_id, "score": lambda: int(option_id)}[qtype]()


def labelled_lines(cases, pick):
    """Each case's request body text with "expected": the option `pick` chooses from the golden probabilities."""
    lines, golden = [], []
    for c in cases:
        expected = {}
        for q in c["questions"]:
            probs = q["probabilities"]
            if len(probs) < 2 and pick is min:
                continue  # a single option is its own argmin
            k = pick(range(len(probs)), key=lambda i: probs[i])
            qtype = TYPES[q["question_type"]]  # the goldens number the types 0, 1, 2
            expected[q["question_id"]] = answer_label(qtype, q["option_ids"][k])
            golden.append((qtype, probs, k))
        body = c["request_body"].rstrip()
        assert body.endswith("}")
        lines.append(body[:-1] + ', "expected": ' + json.dumps(expected) + "}")
    return lines, golden


def wilson(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def expected_metrics(golden):
    """Accuracy, log loss, Brier (sum over options), ECE (10 equal-width bins on the top probability)."""
    n = len(golden)
    correct = loss = brier = 0.0
    bins = [[0, 0.0, 0.0] for _ in range(10)]
    for _, p, y in golden:
        top = max(range(len(p)), key=lambda i: p[i])
        right = top == y
        correct += right
        loss -= math.log(max(p[y], 1e-15))
        brier += sum((p[i] - (1.0 if i == y else 0.0)) ** 2 for i in range(len(p)))
        edge = p[top] * 10
        assert abs(edge - round(edge)) > 1e-4 or p[top] == 1.0, "a confidence sits on a bin edge"
        b = bins[min(9, int(edge))]
        b[0] += 1
        b[1] += p[top]
        b[2] += right
    ece = sum(b[0] / n * abs(b[2] / b[0] - b[1] / b[0]) for b in bins if b[0])
    return {"n": n, "accuracy": correct / n, "log_loss": loss / n, "brier": brier / n, "ece": ece,
            "ci95": wilson(int(correct), n)}


def check_metrics(summary, golden, label):
    metrics = summary["model"]["metrics"]
    for t in ("overall",) + TYPES:
        mine = [g for g in golden if t == "overall" or g[0] == t]
        if not mine:
            continue
        want, got = expected_metrics(mine), metrics[t]
        check(got["n"] == want["n"], f"{label} {t} n {got['n']} vs {want['n']}")
        for key in ("accuracy", "log_loss", "brier", "ece"):
            near(got[key], want[key], TOL, f"{label} {t} {key}")
        for i in range(2):
            near(got["ci95"][i], want["ci95"][i], 1e-9, f"{label} {t} ci95[{i}]")


# ---- batch responses, question by question ----

def batch_answers(model, data):
    out = os.path.join(WORK, os.path.basename(model) + ".batch.jsonl")
    if os.path.exists(out):
        os.remove(out)
    run("batch", "--model", model, "--in", data, "--out", out)
    answers = []
    for line, text in zip(open(data, encoding="utf-8"), open(out, encoding="utf-8")):
        req, resp = json.loads(line), json.loads(text)
        for qid, q in req["questions"].items():
            a = resp["answers"][qid]
            if q["type"] == "noul":
                probs, options = [a["noul"], 1 - a["noul"]], ["true", "false"]
            else:
                options = list(a["probabilities"])
                if q["type"] == "score":
                    options.sort(key=int)
                probs = [a["probabilities"][o] for o in options]
            # The options that may be the first maximum of the unrounded probabilities.
            guess = frozenset(i for i in range(len(probs)) if probs[i] >= max(probs) - 1.01e-4)
            expected = req.get("expected", {}).get(qid)
            truth = None if expected is None else options.index(json.dumps(expected) if q["type"] == "noul"
                                                                  else str(expected))
            answers.append((probs, guess, truth))
    return answers


def mcnemar(b, c):
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


def within(value, lo, hi, what):
    check(lo <= value <= hi, f"{what}: {value} not in [{lo}, {hi}]")


def check_compare(summary, a, b):
    """Where rounding leaves the predicted option open (a near tie), the counts are checked within bounds."""
    g = summary["compare"]["agreement"]["overall"]
    dps = [max(abs(x - y) for x, y in zip(pa, pb)) for (pa, _, _), (pb, _, _) in zip(a, b)]
    check(g["questions"] == len(a), f"compare: questions {g['questions']} vs {len(a)}")
    sure = sum(len(ga) == 1 and ga == gb for (_, ga, _), (_, gb, _) in zip(a, b))
    maybe = sum(bool(ga & gb) for (_, ga, _), (_, gb, _) in zip(a, b))
    within(g["agreeing"], sure, maybe, "compare: agreeing")
    # Each batch probability is rounded to 4 decimals: a difference of two is off by at most 1e-4.
    near(g["mean_abs_dp"], sum(dps) / len(dps), 1.01e-4, "compare: mean |dp|")
    near(g["max_abs_dp"], max(dps), 1.01e-4, "compare: max |dp|")
    check(g["max_abs_dp"] > 0, "compare: the Q8_0 model should differ a little")
    right = lambda guess, t: (guess == {t}, t in guess)  # surely, possibly
    counts = {"only_a_correct": [0, 0], "only_b_correct": [0, 0]}
    for (_, ga, t), (_, gb, _) in zip(a, b):
        if t is None:
            continue
        (sa, pa), (sb, pb) = right(ga, t), right(gb, t)
        counts["only_a_correct"][0] += sa and not pb
        counts["only_a_correct"][1] += pa and not sb
        counts["only_b_correct"][0] += sb and not pa
        counts["only_b_correct"][1] += pb and not sa
    for key, (lo, hi) in counts.items():
        within(g["mcnemar"][key], lo, hi, "compare: McNemar's " + key)
    near(g["mcnemar"]["p_value"], mcnemar(g["mcnemar"]["only_a_correct"], g["mcnemar"]["only_b_correct"]), 1e-12,
         "compare: McNemar p")


# ---- the report in headless Chromium ----

def png_pixels(path):
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6), "8-bit RGB(A) expected"
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, ul = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + left) & 255
            elif f == 2:
                line[i] = (line[i] + up) & 255
            elif f == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(up - ul), abs(left - ul), abs(left + up - 2 * ul)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else ul)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def check_report(report_dir):
    html = os.path.join(report_dir, "index.html")
    base = ["--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + os.path.join(WORK, "chromium"),
            "--enable-logging=stderr", "--v=0", "--window-size=1280,1400"]
    dom = subprocess.run([CHROMIUM, *base, "--dump-dom", "file://" + html], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=120)
    check(dom.returncode == 0, f"chromium --dump-dom exit {dom.returncode}")
    console = [l for l in dom.stderr.splitlines() if ":CONSOLE" in l or "net::ERR" in l]
    check(not console, "console messages: " + "; ".join(console))
    for t in ("overall",) + TYPES:
        check(f'id="reliability-{t}"' in dom.stdout, f"reliability diagram of {t} in the DOM")
    check(dom.stdout.count('class="bar"') >= 4, "reliability bars in the DOM")
    shot = os.path.join(WORK, "report.png")
    subprocess.run([CHROMIUM, *base, "--screenshot=" + shot, "file://" + html], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    width, height, bpp, rows = png_pixels(shot)
    bar = bytes((0x33, 0x66, 0xCC))
    count = sum(row[i:i + 3] == bar for row in rows for i in range(0, width * bpp, bpp))
    check(count > 500, f"the screenshot shows {count} pixels of the reliability bars' blue")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    cases = [c for c in json.load(open(os.path.join(MODEL, "cases.json"), encoding="utf-8"))["cases"]
             if "response" in c]
    short = [c for c in cases if c["max_length"] == 16384]
    cut = [c for c in cases if c["max_length"] != 16384]
    gguf = os.path.join(WORK, "tiny-q8_0.gguf")
    run("convert", "--model", MODEL, "--out", gguf, "--type", "q8_0")

    def data(name, lines):
        path = os.path.join(WORK, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        return path

    lines, golden = labelled_lines(short, max)
    top = data("argmax.jsonl", lines)
    report = os.path.join(WORK, "report")
    summary = json.loads(run("eval", "--model", MODEL, "--data", top, "--compare", gguf, "--report", report,
                             "--fit-temperature"))
    check(json.load(open(os.path.join(report, "summary.json"))) == summary, "summary.json equals stdout")
    check(os.path.exists(os.path.join(report, "calibration.json")), "calibration.json written")
    check(summary["model"]["metrics"]["overall"]["accuracy"] == 1.0, "argmax labels: accuracy 100 %")
    check_metrics(summary, golden, "argmax")
    check_compare(summary, batch_answers(MODEL, top), batch_answers(gguf, top))

    lines, golden = labelled_lines(short, min)
    summary = json.loads(run("eval", "--model", MODEL, "--data", data("argmin.jsonl", lines)))
    check(summary["model"]["metrics"]["overall"]["accuracy"] == 0.0, "argmin labels: accuracy 0 %")
    check_metrics(summary, golden, "argmin")

    for c in cut:
        lines, golden = labelled_lines([c], max)
        summary = json.loads(run("eval", "--model", MODEL, "--max-length", str(c["max_length"]), "--data",
                                 data(c["name"] + ".jsonl", lines)))
        check(summary["model"]["metrics"]["overall"]["accuracy"] == 1.0, c["name"] + ": accuracy 100 %")
        check_metrics(summary, golden, c["name"])

    if CHROMIUM:
        check_report(report)
    else:
        check(False, "chromium not found (scripts/setup installs it)")
    print("check_eval:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
