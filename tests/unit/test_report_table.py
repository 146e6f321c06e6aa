"""mofa.report.table's cells: one number format down a column."""

from mofa.report import table


def test_thousands_are_separated_from_ten_thousand_up():
    # the cluster table's cost column once read 80484.7 above 117,624
    text = table(["cost"], [[80484.7], [117624.0], [1676.84], [0.5]])
    assert text.splitlines()[2:] == ["80,485", "117,624", "1676.8", "0.500"]
