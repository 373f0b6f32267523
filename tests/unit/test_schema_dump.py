"""sql/schema.sql's normalisation of pg_dump's output: stable lines, function bodies intact."""

from __future__ import annotations

from akadze_core.store.migrations import normalise_dump

DUMP = """\
--
-- PostgreSQL database dump
--

\\restrict AbC123

-- Dumped by pg_dump version 15.20
SET statement_timeout = 0;
SELECT pg_catalog.set_config('search_path', '', false);

--
-- Name: f(text); Type: FUNCTION; Schema: akadze; Owner: -
--

CREATE FUNCTION akadze.f(x text) RETURNS text
    LANGUAGE plpgsql
    AS $_$
-- a comment at the start of a body line
BEGIN
    RETURN x || '$$';  -- a dollar pair inside a string
SET nothing = 'inside a body';
END
$_$;



COMMENT ON COLUMN akadze.t.c IS 'it''s -- not a comment, $$ not a quote';

\\unrestrict AbC123
"""

EXPECTED = """\
CREATE FUNCTION akadze.f(x text) RETURNS text
    LANGUAGE plpgsql
    AS $_$
-- a comment at the start of a body line
BEGIN
    RETURN x || '$$';  -- a dollar pair inside a string
SET nothing = 'inside a body';
END
$_$;

COMMENT ON COLUMN akadze.t.c IS 'it''s -- not a comment, $$ not a quote';
"""


def test_pg_dump_comments_and_settings_go_and_function_bodies_stay() -> None:
    assert normalise_dump(DUMP) == EXPECTED


def test_normalising_twice_changes_nothing() -> None:
    assert normalise_dump(EXPECTED) == EXPECTED
