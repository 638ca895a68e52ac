"""dspark.cli: a subcommand module that cannot be imported is an error, not a missing command."""

import dspark.cli as cli


def test_unimportable_subcommand_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, "ghost", "dspark.cmd_ghost_that_does_not_exist")
    assert cli.main(["simulate", "--help"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dspark: error: subcommand 'ghost': module dspark.cmd_ghost")
    assert err.count("\n") == 1


def test_every_subcommand_is_offered(capsys):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(cli.SUBCOMMANDS)


def test_tune_offers_exactly_the_config_choices():
    from tuning.config import OBJECTIVES, SAMPLERS

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    tune = {a.dest: a for a in sub.choices["tune"]._actions}
    assert tuple(tune["objective"].choices) == OBJECTIVES
    assert tuple(tune["sampler"].choices) == SAMPLERS
