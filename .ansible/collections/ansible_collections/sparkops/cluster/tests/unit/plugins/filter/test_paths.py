from ansible_collections.sparkops.cluster.plugins.filter.paths import path_prefixes


def test_path_prefixes_lists_every_parent():
    assert path_prefixes("/var/lib/sparkops/") == ["/", "/var", "/var/lib", "/var/lib/sparkops"]


def test_path_prefixes_normalises_relative_and_dots():
    assert path_prefixes("var//lib/../opt") == ["/", "/var", "/var/opt"]
