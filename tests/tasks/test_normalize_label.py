"""Free-text answers normalised to one of the labels (used when a provider cannot constrain its output)."""

from batch_assets.tasks import normalize_label

LABELS = ["Law Firm", "Healthcare", "Technology", "Real Estate", "Other"]


def test_exact_and_case_insensitive() -> None:
    assert normalize_label("law firm.", LABELS, "Other") == "Law Firm"
    assert normalize_label("  Real-Estate ", LABELS, "Other") == "Real Estate"


def test_first_label_mentioned_wins_else_default() -> None:
    assert normalize_label("This company is in the Healthcare industry, not Technology", LABELS, "Other") == "Healthcare"
    assert normalize_label("A bakery", LABELS, "Other") == "Other"
    assert normalize_label(None, LABELS, "Other") == "Other"
