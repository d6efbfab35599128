# nbgrader configuration for the minivllm course.
#
# `python -m autograder grade` copies this file into the root of the course folder it builds; an
# instructor running nbgrader by hand does the same (see autograder/README.md). Every path below is
# relative to the folder this file sits in, so the course folder can live anywhere writable.
import os

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (
    CheckCellMetadata,
    ClearHiddenTests,
    ClearMarkScheme,
    ClearOutput,
    ComputeChecksums,
    DeduplicateIds,
    GetGrades,
    IncludeHeaderFooter,
    InstantiateTests,
    LockCells,
    OverwriteCells,
    OverwriteKernelspec,
    SaveCells,
)

from autograder.limits import cell_timeout
from autograder.preprocessors import UNGRADED_TAG, BlankSolutions, SkipUngradedCells

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)
here = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "minivllm-v1"
c.CourseDirectory.root = here
# Exchange: a folder inside the course, never /srv (not writable for most users).
c.Exchange.root = os.path.join(here, "exchange")
c.Exchange.path_includes_course = True

# One per-cell limit for the whole course (autograder/limits.py, env MINIVLLM_CELL_TIMEOUT, default 120 s):
# every lesson cell runs in seconds on a 2-core CPU. `python -m autograder grade` also caps each kernel's memory.
c.Execute.timeout = max(1, round(cell_timeout()))
c.Execute.kernel_name = "python3"
c.Execute.interrupt_on_timeout = True
# Autograde runs what scores read — the locked setup, the answers, the grade cells, any cell a student added —
# and skips the release's demo cells (most of each notebook's run; autograder/preprocessors.py).
c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells,
                                      CheckCellMetadata, SkipUngradedCells]
c.Execute.skip_cells_with_tag = UNGRADED_TAG

# Student copies show blanks as the seed does (`plan = ______`) and answers as a short prompt.
c.ClearSolutions.code_stub = {"python": "# 在这里写你的代码\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "（在这里写你的答案）"
c.GenerateAssignment.preprocessors = [
    IncludeHeaderFooter, InstantiateTests, LockCells, BlankSolutions, ClearOutput, CheckCellMetadata,
    ComputeChecksums, SaveCells, ClearHiddenTests, ClearMarkScheme, ComputeChecksums, CheckCellMetadata,
]

# A grade cell that writes to stderr scores 0 in nbgrader: drop harmless warnings before grading.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = (
    r"(UserWarning|DeprecationWarning|FutureWarning|RuntimeWarning|ResourceWarning"
    r"|Matplotlib is building the font cache|Glyph \d+ .*missing from|warnings\.warn\()"
)

# Feedback shows scores, outputs and errors, but not the mark schemes (reference answers) or hidden tests:
# instructors see those in formgrader; students of later sections may not have submitted yet.
c.ClearMarkScheme.enforce_metadata = False  # mark schemes sit in locked question cells (build.manual_answer_cells)
c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, ClearMarkScheme, CSSHTMLHeaderPreprocessor]
