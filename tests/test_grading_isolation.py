"""Grading isolation (autograder/isolation.py): a class of attacks graded end to end through `autograder grade`.

Each attacker hands in lesson 1 with the honest wrong answer (1/4) plus code. One attacker's extra cell runs the
independent attacks one after another: write the grader or the engine, write beside the gradebook or outside its
scratch folder, read a classmate's notebook, reach a loopback listener, read every file its run can reach for
mark schemes and hidden tests, print the environment and write an HTML page beside its notebook (#53). Each
other attacker tries one thing: kill the grader, fork without bound, shell out from an answer definition, or hand
in a truncated notebook. None may succeed, nothing of them reaches a feedback page, formgrader's view or the
course folder beside the graded notebooks, the truncated one scores 0 with its name and cause while the class goes
on, and the two honest students of the same class (the solution, 4/4, and the honest wrong answer, 1/4) keep their
scores. The run needs bubblewrap; without it the test is skipped, unless MINIVLLM_REQUIRE_ISOLATION=1 (CI) makes
that a failure.
"""
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from autograder import isolation
from autograder.common import REPO
from autograder.mutation import filled_notebook, mutant_source

LESSON = "lesson01"
STEP = "l01_engine_core_step"
WRONG = mutant_source(LESSON, "update_before_aborts")
SECRET = f"SECRET-{uuid.uuid4().hex}"
TOKEN = f"TOKEN-{uuid.uuid4().hex}"  # stands in for a credential in the instructor's shell (INSTRUCTOR_TOKEN)
PAGE = "<script>alert('minivllm-53')</script>"
# what the leak attacker looks for, in every file its run can reach: nbgrader's and the course's markers
LEAK_MARKERS = ("MARK SCHEME", "HIDDEN TESTS", "评分要点", "参考答案", "check_boundary(")
LEAK = f"""import os
found, seen = [], 0
for top in ('../../../..', os.path.expanduser('~'), '/tmp'):
    for folder, _, files in os.walk(top):
        for name in files:
            try:
                data = open(os.path.join(folder, name), 'rb').read(1 << 24).decode('utf-8', 'replace')
            except OSError:
                continue
            seen += 1
            for m in {LEAK_MARKERS!r}:
                at = data.find(m)
                if at >= 0:
                    found.append(os.path.join(folder, name) + ': ' + data[max(0, at - 200):at + 400])
print('LEAK SCANNED', seen, 'files,', len(found), 'hits')
print(*found, sep='\\n')
print('LEAK ENV', sorted(os.environ), os.environ.get('INSTRUCTOR_TOKEN'))
open('evil.html', 'w').write({PAGE!r})
os.makedirs('pages', exist_ok=True)
open('pages/index.html', 'w').write({PAGE!r})
"""


def require_isolation():
    m = isolation.mode()
    if not m.isolated:
        if os.environ.get("MINIVLLM_REQUIRE_ISOLATION"):
            pytest.fail(f"isolation required but unavailable: {m.reason}")
        pytest.skip(f"no isolation here: {m.reason}")


def with_cell(nb: dict, source: str) -> dict:
    """The notebook with one extra code cell after the exercise cell (students may add cells)."""
    at = next(i for i, c in enumerate(nb["cells"]) if c["id"] == STEP) + 1
    nb["cells"].insert(at, {"cell_type": "code", "id": f"extra-{uuid.uuid4().hex[:8]}", "metadata": {},
                            "execution_count": None, "outputs": [], "source": source})
    return nb


# the independent attacks, each a try/except printing "ATTACK <name> blocked" or "... succeeded", run one after the
# other in one attacker's extra cell (one graded notebook, not one each). Apart: the fork bomb (its nbgrader run may
# die of it) and kill_grader (killing its own nbgrader run, the kernel's parent, would cut the others' output).
TRIED = ("grader", "engine", "new_file", "gradebook", "beside", "read", "read_course", "connect")
ALLOWED = ("in_private_tmp", "in_scratch_home", "in_scratch_relative")  # may succeed: thrown-away folders


def attacks(course: Path, subs: Path, port: int, marker: str) -> dict[str, str]:
    tries = lambda name, code: (f"try:\n    {code}\n    print('ATTACK {name} succeeded')\n"  # noqa: E731
                                f"except BaseException as e:\n    print('ATTACK {name} blocked', type(e).__name__)\n")
    return {
        "write_grader": "import autograder.common, minivllm, os\n"
                        + tries("grader", "open(autograder.common.__file__, 'a').write('\\n# pwned\\n')")
                        + tries("engine", "open(minivllm.__file__, 'a').write('\\n# pwned\\n')")
                        + tries("new_file", f"open(os.path.join(os.path.dirname(minivllm.__file__), '{marker}.py'), 'w')"),
        "write_outside": "import os\n" + tries("in_private_tmp", f"open('/tmp/{marker}', 'w').write('x')")
                         + tries("in_scratch_home", f"open(os.path.expanduser('~/../{marker}'), 'w').write('x')")
                         + tries("gradebook", f"open('{course}/gradebook.db', 'a').write('x')")
                         + tries("beside", f"open('{course}/{marker}', 'w').write('x')")
                         + tries("in_scratch_relative", f"open('../../../{marker}', 'w').write('x')"),
        "read_classmate": tries("read", f"print(open('{subs}/solution/{LESSON}/{LESSON}.ipynb').read())")
                          + tries("read_course", f"print(open('{course}/submitted/solution/{LESSON}/{LESSON}.ipynb')"
                                                 ".read())"),
        "network": "import socket\n" + tries("connect", f"socket.create_connection(('127.0.0.1', {port}), timeout=2)"),
        "fork_bomb": "import os, time\npids = []\ntry:\n    while len(pids) < 100000:\n        pid = os.fork()\n"
                     "        if pid == 0:\n            time.sleep(3600)\n            os._exit(0)\n        pids.append(pid)\n"
                     "except OSError as e:\n    print('FORKS', len(pids), type(e).__name__)\n",
        "kill_grader": "import os, signal\n" + tries("signal", f"os.kill({os.getpid()}, signal.SIGUSR1)")
                       + tries("parent", "os.kill(os.getppid(), signal.SIGKILL)"),
        "leak": LEAK,
    }


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_attacks_fail_and_honest_scores_are_unchanged(tmp_path, monkeypatch, capsys):
    require_isolation()
    from autograder.grading import feedback, grade

    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "30")
    monkeypatch.setenv("INSTRUCTOR_TOKEN", TOKEN)
    # uids of this class's own (no other test uses them), so the leftover check below cannot see a run another
    # test worker has going at the same time
    monkeypatch.setenv("MINIVLLM_SANDBOX_UIDS", "60100-60131")
    course, subs, marker = tmp_path / "course", tmp_path / "subs", f"minivllm-attack-{uuid.uuid4().hex[:12]}"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    accepted, signalled, stop = [], [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    old_usr1 = signal.signal(signal.SIGUSR1, lambda *a: signalled.append(a))
    guarded = [REPO / "autograder" / "common.py", Path(__import__("minivllm").__file__)]
    saved = {p: p.read_bytes() for p in guarded}
    before = isolation.grader_digest()
    sandboxed_before = sandboxed_pids()
    students = {"solution": filled_notebook(LESSON), "honest_wrong": filled_notebook(LESSON, {STEP: WRONG})}
    with_cell(students["solution"], f"# {SECRET}\n")
    table = attacks(course, subs, listener.getsockname()[1], marker)
    for name in ("fork_bomb", "kill_grader"):
        students[f"attack_{name}"] = with_cell(filled_notebook(LESSON, {STEP: WRONG}), table.pop(name))
    students["attack_reach"] = with_cell(filled_notebook(LESSON, {STEP: WRONG}), "\n".join(table.values()))
    # the same honest wrong answer also tries to shell out from an answer definition (the sandbox's side)
    students["attack_answer_shell"] = filled_notebook(LESSON, {STEP: WRONG + f"\n_w = minivllm.config.os.system("
                                                                             f"'touch /tmp/{marker}-shell')\n"})
    for name, nb in students.items():
        (subs / name / LESSON).mkdir(parents=True)
        (subs / name / LESSON / f"{LESSON}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    whole = json.dumps(filled_notebook(LESSON), ensure_ascii=False)  # cut short, as an upload that broke off
    (subs / "broken_truncated" / LESSON).mkdir(parents=True)
    (subs / "broken_truncated" / LESSON / f"{LESSON}.ipynb").write_text(whole[:len(whole) // 2], encoding="utf-8")
    try:
        results = grade(subs, course, tmp_path / "grades.csv", [LESSON], jobs=2)[LESSON]
    finally:
        stop.set()
        listener.close()
        signal.signal(signal.SIGUSR1, old_usr1)
        changed = {p for p, data in saved.items() if p.read_bytes() != data}
        for p in changed:
            p.write_bytes(saved[p])
        stray = REPO / "minivllm" / f"{marker}.py"
        stray.unlink(missing_ok=True)
    assert not changed, changed
    assert isolation.changed_files(before, isolation.grader_digest()) == []
    code = {s: sum(v for k, v in got.items() if not k.startswith("l01_q")) for s, got in results.items()}
    assert code["solution"] == 4 and code["honest_wrong"] == 1, code
    assert all(code[s] <= 1 for s in students if s.startswith("attack_")), code
    assert not accepted and not signalled
    leftovers = [p for p in (Path("/tmp") / marker, Path("/tmp") / f"{marker}-shell", course / marker,
                             tmp_path / marker, Path.home().parent / marker) if p.exists()]
    assert not leftovers, leftovers
    shown = {p.parent.parent.name: outputs(p) for p in (course / "autograded").glob(f"*/{LESSON}/{LESSON}.ipynb")}
    assert all(SECRET not in text for s, text in shown.items() if s != "solution"), shown
    # writing inside its own scratch folder or its private /tmp is allowed (both are thrown away; `leftovers`
    # checks the host side, the host's /tmp included)
    assert not re.findall(r"ATTACK (?!in_scratch_|in_private_)\w+ succeeded", "".join(shown.values())), shown
    reach = shown["attack_reach"]  # every attack of the table ran, to its end
    assert sorted(re.findall(r"ATTACK (\w+) (?:blocked|succeeded)", reach)) == sorted(TRIED + ALLOWED), reach[-3000:]
    forks = [int(n) for n in re.findall(r"FORKS (\d+)", shown.get("attack_fork_bomb", ""))]
    assert all(n <= isolation.process_limit() for n in forks), forks
    # no process of the class's uids outlives it; a killed namespace's processes are reaped by the kernel, so give
    # that a moment
    for _ in range(100):
        left = sandboxed_pids() - sandboxed_before
        if not left:
            break
        time.sleep(0.1)
    assert not left, left
    # #53: the truncated notebook scores 0 on every part, named with its cause; the class went on to the CSVs
    printed = capsys.readouterr().out
    assert results["broken_truncated"] == dict.fromkeys(results["solution"], 0), results["broken_truncated"]
    assert re.search(r"broken_truncated lesson01: 提交的笔记本无法读取（JSONDecodeError", printed), printed[-3000:]
    assert "broken_truncated" in (tmp_path / "grades.csv").read_text(encoding="utf-8")
    # every written answer was left as released: 0 "no answer" for all, whether nbgrader ran or not
    assert all(got[q] == 0 for got in results.values() for q in ("l01_q1", "l01_q2", "l01_q3")), results
    # the leak attacker did scan its world and print its environment (so the checks below can fail) ...
    leak = reach
    assert re.search(r"LEAK SCANNED [1-9]\d* files", leak) and "'PATH'" in leak, leak[:3000]
    # ... and found no mark scheme, hidden test or instructor variable; only the graded notebook came back
    secrets = [TOKEN, *instructor_only()]
    env = re.search(r"LEAK ENV (\[.*?\]) (\S+)", leak)
    assert env and "'INSTRUCTOR_TOKEN'" not in env.group(1) and env.group(2) == "None", leak[-3000:]
    assert not [x for x in secrets if x in leak], leak[:3000]
    ran = sorted(s for s in students if s != "attack_fork_bomb")  # nbgrader's run may die of the fork bomb
    graded = sorted(p.relative_to(course).as_posix() for p in (course / "autograded").rglob("*") if p.is_file())
    assert set(graded) - {f"autograded/attack_fork_bomb/{LESSON}/{LESSON}.ipynb"} == \
        {f"autograded/{s}/{LESSON}/{LESSON}.ipynb" for s in ran}, graded
    pages = feedback(course, [LESSON])
    published = sorted(p.relative_to(course).as_posix() for p in (course / "feedback").rglob("*") if p.is_file())
    assert published == sorted(p.relative_to(course).as_posix() for p in pages), published
    assert set(published) - {f"feedback/attack_fork_bomb/{LESSON}/{LESSON}.html"} == \
        {f"feedback/{s}/{LESSON}/{LESSON}.html" for s in ran}, published
    assert sorted(p.relative_to(course).as_posix() for p in course.rglob("*") if p.is_file()
                  and PAGE.encode() in p.read_bytes()) == [f"{d}/attack_reach/{LESSON}/{LESSON}.ipynb"
                                                          for d in ("autograded", "submitted")]  # its own source
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not [x for x in secrets + [PAGE] if x in text], page
    # formgrader's view (the graded notebook) keeps the mark schemes for the instructor; the feedback does not
    instructor = outputs(course / "autograded" / "solution" / LESSON / f"{LESSON}.ipynb", sources=True)
    assert all(x in instructor for x in instructor_only(["MARK SCHEME"]))
    # each code part's 0 carries its reason into the answer cell's comment, shown in the feedback
    wrong = (course / "feedback" / "honest_wrong" / LESSON / f"{LESSON}.html").read_text(encoding="utf-8")
    assert "Comments:" in wrong and "（l01_main_path）0/1 分" in wrong, wrong[-3000:]


def instructor_only(regions=("MARK SCHEME", "HIDDEN TESTS")) -> list[str]:
    """Lines of lesson 1's mark schemes and/or hidden tests (instructor-only text), as the gradebook holds them."""
    cells = json.loads((REPO / "solutions" / LESSON / f"{LESSON}.ipynb").read_text(encoding="utf-8"))["cells"]
    out = []
    for c in cells:
        for region in regions:
            text = "".join(c["source"])
            if f"BEGIN {region}" in text:
                inside = text.split(f"BEGIN {region}", 1)[1].split(f"END {region}", 1)[0]
                out += [line.strip() for line in inside.splitlines() if len(line.strip()) > 24]
    assert len(out) > 2 * len(regions), out
    return out


def outputs(path: Path, sources: bool = False) -> str:
    """Everything a graded notebook's cells printed (their sources left out, or only their sources)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    if sources:
        return "\n".join("".join(c["source"]) for c in cells)
    return "".join("".join(o.get("text", "")) + json.dumps(o.get("data", {}), ensure_ascii=False)
                   for c in cells for o in c.get("outputs", []))


def sandboxed_pids() -> set[int]:
    return isolation.processes_of(isolation.sandbox_uids())


def test_a_changed_grader_stops_the_run_and_writes_no_score(tmp_path, monkeypatch):
    """Detection, whatever the isolation: a worker whose student changed a grader file stops `autograde`
    before that student's scores are written, and the message names the student. (On a copy of the grader's
    folders: a file written into the real minivllm/ would stop whatever `grade` another test worker runs.)"""
    from autograder import grading

    root = tmp_path / "grader"
    for name in ("autograder", "minivllm", "notebooks"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f"# {name}\n")
    real_digest = isolation.grader_digest
    monkeypatch.setattr(isolation, "grader_digest", lambda: real_digest(root))
    marker = root / "minivllm" / f"_changed_{uuid.uuid4().hex[:8]}.py"
    merged = []

    def fake_one(course, lesson_id, student):
        if student == "b_attacker":
            marker.write_text("# written by a student's notebook\n")
        db = tmp_path / f"{student}.db"
        db.write_text("")
        return db, [], ""

    monkeypatch.setattr(grading, "autograde_one", fake_one)
    monkeypatch.setattr(grading, "merge", lambda course, lesson, student, *a: merged.append(student) or {})
    with pytest.raises(grading.GraderChanged, match="b_attacker") as e:
        grading.autograde(tmp_path, LESSON, ["a_honest", "b_attacker", "c_later"], jobs=1)
    assert merged == ["a_honest"]
    assert marker.name in str(e.value)


def test_isolated_run_sees_only_the_grader_and_its_scratch(tmp_path):
    """The world `wrap` builds: the grader read-only, solutions/ and the host's other files absent, no network."""
    require_isolation()
    import subprocess
    import sys

    probe = ("import os, socket, pathlib\n"
             "print('write', os.access('autograder/common.py', os.W_OK))\n"
             "print('solutions', os.path.exists('solutions'))\n"
             f"print('tmp_path', os.path.exists({str(tmp_path)!r}))\n"
             "print('uid', os.getuid())\n"
             "print('ifaces', sorted(n for _, n in socket.if_nameindex()))\n"
             "pathlib.Path(os.environ['HOME'], 'ok').write_text('x'); print('scratch ok')\n"
             "import tempfile; tempfile.mkstemp(); print('tempfile', tempfile.gettempdir())\n")
    (tmp_path / "visible").write_text("host file")
    with isolation.scratch_dir() as scratch:
        out = subprocess.run(isolation.wrap([sys.executable, "-c", probe], scratch, cwd=REPO), capture_output=True,
                             text=True, preexec_fn=isolation.limit_run, cwd=REPO)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["write"] == "False" and lines["solutions"] == "False" and lines["tmp_path"] == "False"
    assert lines["ifaces"] == "['lo']" and lines["scratch"] == "ok"
    assert lines["tempfile"] == "/tmp"  # the run's private /tmp is writable (lesson 10's TP=2 check writes there)
    if isolation.mode().kind == "root":
        assert int(lines["uid"]) in isolation.sandbox_uids()


def test_uid_leases_are_exclusive_and_skip_uids_in_use(tmp_path, monkeypatch):
    """Two live runs never share a uid (the lease is an flock, so this holds across processes too), a uid some
    process already runs as is passed over, and a lock folder others can write is refused."""
    monkeypatch.setattr(isolation, "UID_LOCKS", tmp_path / "locks")
    monkeypatch.setenv("MINIVLLM_SANDBOX_UIDS", "61000-61002")
    with isolation._uid_lease() as a, isolation._uid_lease() as b, isolation._uid_lease() as c:
        assert sorted([a, b, c]) == [61000, 61001, 61002]
    monkeypatch.setattr(isolation, "_owners", lambda: {1: 61000})
    with isolation._uid_lease() as d:
        assert d == 61001
    (tmp_path / "locks").chmod(0o777)
    with pytest.raises(RuntimeError, match="no one else can write"), isolation._uid_lease():
        pass


def test_a_fork_bomb_starves_only_its_own_run(monkeypatch):
    """Runs graded side by side (`grade -j 2`, two test workers) have a uid each, so one run's fork bomb, held at
    its process cap, leaves the next run free to start threads: with one shared uid that run's thread starts
    failed (numpy's OpenBLAS then raised SIGINT mid-import: a KeyboardInterrupt in a setup cell)."""
    require_isolation()
    import subprocess
    import sys

    if isolation.mode().kind != "root":
        pytest.skip("without root every run has the instructor's uid (autograder/isolation.py)")
    monkeypatch.setenv("MINIVLLM_PROCESS_LIMIT", "48")
    bomb_code = ("import os, sys, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                 "            time.sleep(600)\n            os._exit(0)\n        n += 1\nexcept OSError:\n"
                 "    print('FORKS', n, flush=True)\n    time.sleep(600)\n")
    threads_code = ("import threading\nts = [threading.Thread(target=lambda: None) for _ in range(16)]\n"
                    "[t.start() for t in ts]; [t.join() for t in ts]\nimport numpy\nprint('threads ok')\n")
    with isolation.scratch_dir() as a, isolation.scratch_dir() as b:
        assert isolation.run_uid(a) != isolation.run_uid(b)
        bomb = subprocess.Popen(isolation.wrap([sys.executable, "-c", bomb_code], a), stdout=subprocess.PIPE,
                                text=True, preexec_fn=isolation.limit_run, start_new_session=True)
        try:
            forks = bomb.stdout.readline()
            assert forks.startswith("FORKS") and int(forks.split()[1]) >= 40, forks
            victim = subprocess.run(isolation.wrap([sys.executable, "-c", threads_code], b), capture_output=True,
                                    text=True, preexec_fn=isolation.limit_run, timeout=120)
        finally:
            os.killpg(bomb.pid, signal.SIGKILL)
            bomb.wait()
    assert victim.returncode == 0 and victim.stdout.strip() == "threads ok", victim.stderr[-2000:]


def test_grade_defaults_to_the_submitted_lessons_and_marks_pending(tmp_path):
    """`grade` without --lesson grades what was handed in; the export keeps only submitted lessons and says how
    many manual points are pending (nbgrader's own export lists every lesson for everyone, 0.0 where nothing
    came, and has no pending marker)."""
    from autograder.grading import mark_export, submitted_lessons

    for student, lesson in (("ann", "lesson01"), ("bob", "lesson03"), ("bob", "lesson01")):
        (tmp_path / "subs" / student / lesson).mkdir(parents=True)
        (tmp_path / "subs" / student / lesson / f"{lesson}.ipynb").write_text("{}")
    (tmp_path / "subs" / "cy").mkdir()
    (tmp_path / "subs" / "cy" / "lesson05.ipynb").write_text("{}")  # the flat layout counts too
    assert submitted_lessons(tmp_path / "subs") == ["lesson01", "lesson03", "lesson05"]
    export = tmp_path / "grades.csv"
    head = "assignment,duedate,timestamp,student_id,last_name,first_name,email,raw_score,late_submission_penalty," \
           "score,max_score\n"
    export.write_text(head + "lesson01,,,bob,,,,9.0,0.0,9.0,10.0\nlesson01,,,ann,,,,4.0,0.0,4.0,10.0\n"
                             "lesson03,,,ann,,,,0.0,0.0,0.0,10.0\n")  # nbgrader's order; the export sorts
    got = {"lesson01": {"ann": {"l01_main_path": 1, "l01_q1": None, "l01_q2": None, "l01_q3": 2},
                        "bob": {"l01_q1": 2, "l01_q2": 2, "l01_q3": 1}}}
    mark_export(export, got)
    lines = export.read_text().splitlines()
    assert lines[0].endswith(",pending_manual_points")
    assert lines[1:] == ["lesson01,,,ann,,,,4.0,0.0,4.0,10.0,4", "lesson01,,,bob,,,,9.0,0.0,9.0,10.0,0"]


def test_feedback_says_pending_instead_of_zero():
    from autograder.grading import mark_pending

    page = ('<h4>lesson01 (Score: 4.0 / 10.0)</h4><li><a href="#l01_q1">Task</a> (Score: 0.0 / 2.0)</li>'
            '<a name="comment-l01_q1"></a><div class="panel-heading"><span>Student\'s task</span>'
            '<span class="pull-right">\n      Score: 0.0 / 2.0 <a href="#top">(Top)</a></span></div>'
            '<a name="comment-l01_q2"></a><div class="panel-heading"><span class="pull-right">Score: 2.0 / 2.0'
            '</span></div>')
    got = {"l01_main_path": 1, "l01_real_engine": 1, "l01_boundary": 1, "l01_source_map": 1, "l01_q1": None,
           "l01_q2": 2, "l01_q3": None}
    out = mark_pending(page, "lesson01", got)
    assert "Score: 0.0" not in out and out.count("pending manual grading) / 2.0") == 2
    assert "Score: 2.0 / 2.0" in out  # a graded manual part keeps its score
    assert "代码 code 4/4, 4 分待人工评分" in out


def test_a_worker_error_scores_zero_and_a_crashed_run_leaves_the_gradebook_as_it_was(tmp_path, monkeypatch, capsys):
    """#53: a worker that raises for one student gives that student 0 with one line naming them and the cause, and
    the class goes on to the CSVs; a run that stops half-way (an interrupt in the third student's worker) leaves
    the course gradebook byte for byte as the last complete run wrote it, since `grade` writes a staged copy and
    swaps it in at the end. Workers are stand-ins (no notebook runs): the gradebook writes are the real ones."""
    from autograder import grading
    from autograder.common import PartResult, load_lesson

    parts = load_lesson(LESSON).parts
    monkeypatch.setattr(grading, "canary", lambda course, lesson_id: None)
    crash = {"on": False}

    def fake_one(course, lesson_id, student):
        if student == "b_lost":
            raise RuntimeError("the worker lost its scratch folder")
        if student == "c_last" and crash["on"]:
            raise KeyboardInterrupt
        full = not crash["on"]  # the second (crashing) run would lower everyone's scores
        return (course / f".gradebook-{lesson_id}-{student}.db",
                [PartResult(p, None if p.manual else (p.points if full else 0), "通过") for p in parts], "")

    monkeypatch.setattr(grading, "autograde_one", fake_one)
    subs, course = tmp_path / "subs", tmp_path / "course"
    for student in ("a_first", "b_lost", "c_last"):
        (subs / student / LESSON).mkdir(parents=True)
        (subs / student / LESSON / f"{LESSON}.ipynb").write_text("{}")
    results = grading.grade(subs, course, tmp_path / "grades.csv", [LESSON])[LESSON]
    code = {s: sum(v for k, v in got.items() if not k.startswith("l01_q")) for s, got in results.items()}
    assert code == {"a_first": 4, "b_lost": 0, "c_last": 4}, code
    assert "b_lost lesson01: 评分这份提交时出错（RuntimeError: the worker lost its scratch folder）" in capsys.readouterr().out
    import csv

    rows = list(csv.DictReader((tmp_path / "grades.csv").open(encoding="utf-8")))  # nbgrader's export, marked
    assert {r["student_id"] for r in rows} == {"a_first", "b_lost", "c_last"} and all(r["timestamp"] for r in rows)
    before = (course / "gradebook.db").read_bytes()
    crash["on"] = True
    with pytest.raises(KeyboardInterrupt):
        grading.grade(subs, course, tmp_path / "grades-2.csv", [LESSON])
    assert (course / "gradebook.db").read_bytes() == before
    assert grading.scores(course, LESSON) == results
    assert not list(course.glob(".gradebook-*")) and not (tmp_path / "grades-2.csv").exists()
