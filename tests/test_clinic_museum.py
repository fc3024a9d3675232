"""clinic.museum_patients where the museum is missing (a pip install without the repository,
as on Colab): a FileNotFoundError that says where the museum lives, which chapter 11 catches."""

from __future__ import annotations

import pytest

from companion import clinic
from companion.clinic import registry


def test_missing_catalogue_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(registry, "MUSEUM", "no/such/catalogue.py")  # the default root, no museum
    with pytest.raises(FileNotFoundError) as caught:
        clinic.museum_patients()
    message = str(caught.value)
    assert "the bug museum is not at" in message and "no/such/catalogue.py" in message
    assert "pass root=" in message and "clone of the course repository" in message


def test_the_default_root_finds_the_museum_in_a_clone():
    patients = clinic.museum_patients()
    assert len(patients) >= 60, len(patients)
    assert {"id", "bug", "path", "tests"} <= set(patients[0])
