"""Settings for every test directory."""

from hypothesis import settings

# A loaded CI machine (two cores, an apiserver and agent processes beside the tests) runs some
# examples slower than Hypothesis's 200 ms default deadline; a deadline miss there says nothing
# about the code under test, so no property or state-machine test has one.
settings.register_profile("nodeagent", deadline=None, print_blob=True)
settings.load_profile("nodeagent")
