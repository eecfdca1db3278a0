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


def test_the_readme_gives_the_number_of_mutations_the_list_has():
  """A number in the README that describes the suite comes from the code: `--list`'s count."""
  import re
  import subprocess
  import sys
  listed = subprocess.run([sys.executable, "tests/mutations.py", "--list"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
  count = len([line for line in listed.splitlines() if line and not line.startswith(" ")])
  assert count == len(mutations.MUTATIONS)
  readme = open(os.path.join(REPO, "README.md")).read()
  assert re.findall(r"the (\d+) mutations", readme) == [str(count)], "update the count in README.md"
