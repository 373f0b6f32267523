"""Celery's canvas (akadze_compat) in Citus mode, on the cluster: the compat canvas and
Task.replace tests run as written, each chain, group and chord one workflow placed in one
shard (a replacement in the same queue lands in its shard)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from akadze_compat import Celery
from akadze_core import App
from tests.compat.test_canvas import (  # noqa: F401  (collected here, on the cluster)
    test_a_big_groups_members_store_the_meta_built_in_full,
    test_a_canvas_in_a_rolled_back_transaction_inserts_nothing,
    test_a_canvas_round_trips_through_json_and_runs,
    test_a_chain_fans_out_to_a_group,
    test_a_chain_is_one_insert_and_passes_each_result_on,
    test_a_chord_body_chain_and_its_errback,
    test_a_chord_calls_its_body_with_the_list,
    test_a_chord_header_is_its_own_copies_and_takes_tasks,
    test_a_chord_of_chords,
    test_a_chords_errback_runs_once_when_a_chord_in_its_header_fails,
    test_a_chords_link_options_add_to_its_bodys_own,
    test_a_failed_member_fails_the_body_with_a_chord_error,
    test_a_failed_step_stops_the_chain_and_calls_its_errbacks,
    test_a_group_body_fails_with_the_header_members_own_exception,
    test_a_group_is_built_with_the_collector_paused,
    test_a_group_of_alike_members_is_told_at_once_and_equals_rows_built_in_full,
    test_a_group_of_chains,
    test_a_group_result_is_saved_and_restored,
    test_a_group_returns_a_group_result_in_order,
    test_a_group_with_a_failure_raises_it_in_order,
    test_a_groups_state_is_one_read_of_its_unfinished_members,
    test_a_header_member_giving_a_list_gives_the_body_that_list,
    test_a_retried_step_passes_its_final_result_once,
    test_a_task_returning_a_result_stores_its_tuple_form,
    test_a_task_used_as_a_base_class_keeps_s_and_si,
    test_an_immutable_step_ignores_the_previous_result,
    test_chord_header_then_body_and_group_or_task,
    test_chunks_map_and_starmap,
    test_empty_chains_in_a_group_or_chord_header_are_dropped,
    test_freeze_gives_the_ids_sending_uses,
    test_get_inside_a_task_is_refused_unless_allowed,
    test_link_error_on_a_single_task_and_on_error,
    test_link_runs_the_callback_with_the_result,
    test_members_see_their_group_and_a_revoked_member_fails_the_body,
    test_partial_args_go_to_the_first_step,
    test_plain_members_added_at_once_equal_rows_built_in_full,
    test_plain_members_are_known_by_ids_derived_from_their_jobs,
    test_reused_rows_equal_rows_built_in_full,
    test_revoking_a_chains_head_stops_the_rest,
    test_revoking_a_group_revokes_its_members,
    test_subtask_types_rebuild_their_classes,
    test_task_id_names_the_tail_and_options_go_to_the_first_step,
    test_the_chain_class_celery_canvas_exports_builds_a_chain,
)
from tests.compat.test_replace import (  # noqa: F401
    test_a_chain_ending_in_a_group_gives_the_groups_list,
    test_a_chains_rest_runs_after_the_replacement,
    test_a_chord_member_replaced_keeps_its_place,
    test_a_group_member_replaced_and_a_replacement_replaced_again,
    test_a_link_callback_gets_the_replacements_result,
    test_a_replaced_group_gives_its_list,
    test_a_replacement_in_a_chord_is_refused,
    test_a_task_replaced_by_a_chord_passes_on_the_bodys_result,
    test_an_async_task_replaces_itself,
    test_an_empty_chain_is_refused,
    test_build_graph_has_the_result_and_its_children,
    test_dependency_graph_orders_detects_cycles_and_draws,
    test_eager_replace_returns_the_replacements_result,
    test_the_callers_result_gives_the_replacements,
    test_the_replacements_failure_reaches_the_errbacks_and_stops_the_chain,
)


@pytest.fixture
def db(citus_db: psycopg.Connection) -> psycopg.Connection:
    """The compat tests' ``db``: the coordinator, one lane per queue."""
    citus_db.execute("UPDATE akadze.citus_settings SET lanes = 1")
    return citus_db


@pytest.fixture
def database_url(citus_url: str) -> str:
    return citus_url


@pytest.fixture
async def celery(citus_app: App, db: psycopg.Connection,
                 citus_url: str) -> AsyncIterator[Celery]:
    """A Celery app on the coordinator; the process runs the Citus dialect (citus_app)."""
    app = Celery("proj", broker=citus_url, set_as_current=False)
    yield app
    if app._core is not None:
        await app._core.close_async()
    app.close()
