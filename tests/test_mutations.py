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
