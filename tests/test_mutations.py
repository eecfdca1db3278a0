"""tests/mutations.py stays runnable: every mutation's text is in its file once, every test it names exists.

(Running the mutations themselves takes minutes: `python tests/mutations.py`, see its docstring.)
"""

import os

from tests import mutations
from tests.helpers import REPO


def test_every_mutation_applies_and_names_tests_that_exist():
  assert mutations.check_texts(mutations.MUTATIONS, REPO) == []
  names = [m.name for m in mutations.MUTATIONS]
  assert len(names) == len(set(names))
  for m in mutations.MUTATIONS:
    assert m.old != m.new, m.name
    for node in m.tests:
      path, test = node.split("::")
      with open(os.path.join(REPO, path)) as f:
        assert f"def {test.split('[')[0]}(" in f.read(), (m.name, node)


def test_list_counts_the_mutations_and_the_readme_writes_no_count_by_hand():
  """A count that describes the suite is printed by the code (`--list`'s last line), never
  written into the README by hand, where it would drift with each new mutation."""
  import re
  import subprocess
  import sys
  listed = subprocess.run([sys.executable, "tests/mutations.py", "--list"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.splitlines()
  names = [line for line in listed[:-1] if line and not line.startswith(" ")]
  assert len(names) == len(mutations.MUTATIONS)
  assert listed[-1] == (f"{len(names)} mutations, {sum(m.ci for m in mutations.MUTATIONS)} of them "
                        "in the --ci subset")
  readme = open(os.path.join(REPO, "README.md")).read()
  assert not re.findall(r"\b\d+ mutations", readme), "README.md: let `--list` give the count"
