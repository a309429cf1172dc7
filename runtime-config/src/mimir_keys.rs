//! Grafana Mimir's runtime-config keys that weir accepts without enforcing them, so an
//! operator's existing Mimir overrides file loads unchanged, and where each one stands: a
//! setting of another Mimir component (it never applied to a distributor), or a distributor's
//! setting weir does not implement (with what that means for the pushes).
//!
//! Taken from Mimir's `pkg/util/validation/limits.go` (`Limits` yaml tags, and which component
//! reads each limit) and `pkg/mimir/runtime_config.go`, including keys older Mimir versions
//! had. The keys weir enforces are not here: they are `TenantOverride`'s and
//! `InstanceOverride`'s fields. `docs/mimir-keys.md` is the operator's view of these tables.

/// Where a Mimir key that weir does not enforce stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Another Mimir component reads it (named); it never applied to a distributor.
    NotForADistributor(&'static str),
    /// A distributor's setting weir does not enforce; why, and what happens instead.
    Ignored(&'static str),
}

/// Where a per-tenant key (under `overrides.<tenant>`) stands; `None`: not a Mimir key.
pub(crate) fn limit(key: &str) -> Option<Standing> {
    lookup(NOT_FOR_A_DISTRIBUTOR, key)
        .map(Standing::NotForADistributor)
        .or_else(|| lookup(IGNORED, key).map(Standing::Ignored))
}

/// Where a top-level section stands; `None`: not a Mimir section.
pub(crate) fn section(key: &str) -> Option<Standing> {
    lookup(SECTIONS_NOT_FOR_A_DISTRIBUTOR, key).map(Standing::NotForADistributor)
}

/// The tables are sorted by key (a test checks), so a binary search finds a key.
fn lookup(table: &'static [(&'static str, &'static str)], key: &str) -> Option<&'static str> {
    table
        .binary_search_by(|(name, _)| (*name).cmp(key))
        .ok()
        .map(|index| table[index].1)
}

/// Top-level sections of Mimir's runtime config besides `overrides` and `distributor_limits`,
/// with the component that reads each.
pub(crate) const SECTIONS_NOT_FOR_A_DISTRIBUTOR: &[(&str, &str)] = &[
    ("ingester_limits", INGESTER),
    ("ingester_stream_chunks_when_using_blocks", INGESTER),
    (
        "multi_kv_config",
        "Mimir's ring KV store (its migration between stores)",
    ),
];

const ALERTMANAGER: &str = "alertmanager";
const COMPACTOR: &str = "compactor";
const INGESTER: &str = "ingester";
const OBJECT_STORAGE: &str = "object storage (every component's bucket client)";
const QUERIER: &str = "querier";
const QUERY_FRONTEND: &str = "query-frontend";
const RULER: &str = "ruler";
const STORE_GATEWAY: &str = "store-gateway";

/// Per-tenant keys that another Mimir component reads, with that component. A distributor
/// never applied them; Mimir's ingesters enforce the series, metadata and exemplar totals.
pub(crate) const NOT_FOR_A_DISTRIBUTOR: &[(&str, &str)] = &[
    ("active_series_additional_custom_trackers", INGESTER),
    ("active_series_custom_trackers", INGESTER),
    ("active_series_results_max_size_bytes", QUERIER),
    ("alertmanager_max_alerts_count", ALERTMANAGER),
    ("alertmanager_max_alerts_size_bytes", ALERTMANAGER),
    ("alertmanager_max_config_size_bytes", ALERTMANAGER),
    (
        "alertmanager_max_dispatcher_aggregation_groups",
        ALERTMANAGER,
    ),
    ("alertmanager_max_grafana_config_size_bytes", ALERTMANAGER),
    ("alertmanager_max_grafana_state_size_bytes", ALERTMANAGER),
    ("alertmanager_max_silence_size_bytes", ALERTMANAGER),
    ("alertmanager_max_silences_count", ALERTMANAGER),
    ("alertmanager_max_template_size_bytes", ALERTMANAGER),
    ("alertmanager_max_templates_count", ALERTMANAGER),
    ("alertmanager_notification_rate_limit", ALERTMANAGER),
    (
        "alertmanager_notification_rate_limit_per_integration",
        ALERTMANAGER,
    ),
    ("alertmanager_notify_hook_receivers", ALERTMANAGER),
    ("alertmanager_notify_hook_timeout", ALERTMANAGER),
    ("alertmanager_notify_hook_url", ALERTMANAGER),
    (
        "alertmanager_receivers_firewall_block_cidr_networks",
        ALERTMANAGER,
    ),
    (
        "alertmanager_receivers_firewall_block_private_addresses",
        ALERTMANAGER,
    ),
    ("align_queries_with_step", QUERY_FRONTEND),
    ("blocked_queries", QUERY_FRONTEND),
    ("blocked_requests", QUERY_FRONTEND),
    ("cache_unaligned_requests", QUERY_FRONTEND),
    ("cardinality_analysis_enabled", QUERIER),
    ("cardinality_analysis_max_results", QUERIER),
    ("compactor_block_upload_enabled", COMPACTOR),
    ("compactor_block_upload_max_block_size_bytes", COMPACTOR),
    ("compactor_block_upload_validation_enabled", COMPACTOR),
    ("compactor_block_upload_verify_chunks", COMPACTOR),
    ("compactor_blocks_retention_period", COMPACTOR),
    ("compactor_in_memory_tenant_meta_cache_size", COMPACTOR),
    ("compactor_max_lookback", COMPACTOR),
    ("compactor_max_per_block_upload_concurrency", COMPACTOR),
    ("compactor_partial_block_deletion_delay", COMPACTOR),
    ("compactor_split_and_merge_shards", COMPACTOR),
    ("compactor_split_groups", COMPACTOR),
    ("compactor_tenant_shard_size", COMPACTOR),
    (
        "early_head_compaction_min_estimated_series_reduction_percentage",
        INGESTER,
    ),
    ("early_head_compaction_owned_series_threshold", INGESTER),
    ("enable_delayed_name_removal", QUERIER),
    ("enabled_promql_experimental_functions", QUERIER),
    ("enabled_promql_extended_range_selectors", QUERIER),
    ("ignore_ooo_exemplars", INGESTER),
    ("ingest_storage_read_consistency", QUERIER),
    ("label_names_and_values_results_max_size_bytes", QUERIER),
    (
        "label_values_max_cardinality_label_names_per_request",
        QUERIER,
    ),
    ("labels_query_optimizer_enabled", QUERIER),
    ("limited_queries", QUERY_FRONTEND),
    ("max_cache_freshness", QUERY_FRONTEND),
    ("max_estimated_fetched_chunks_per_query_multiplier", QUERIER),
    ("max_estimated_memory_consumption_per_query", QUERIER),
    ("max_fetched_chunk_bytes_per_query", QUERIER),
    ("max_fetched_chunks_per_query", QUERIER),
    ("max_fetched_series_per_query", QUERIER),
    ("max_global_metadata_per_metric", INGESTER),
    ("max_global_metadata_per_user", INGESTER),
    ("max_global_series_per_metric", INGESTER),
    ("max_global_series_per_user", INGESTER),
    ("max_label_names_limit", QUERIER),
    ("max_label_values_limit", QUERIER),
    ("max_labels_query_length", QUERIER),
    ("max_partial_query_length", QUERIER),
    ("max_queriers_per_tenant", QUERY_FRONTEND),
    ("max_query_expression_size_bytes", QUERY_FRONTEND),
    ("max_query_length", QUERY_FRONTEND),
    ("max_query_lookback", QUERIER),
    ("max_query_parallelism", QUERY_FRONTEND),
    ("max_series_query_limit", QUERIER),
    ("max_total_query_length", QUERY_FRONTEND),
    ("ooo_native_histograms_ingestion_enabled", INGESTER),
    ("out_of_order_blocks_external_label_enabled", INGESTER),
    ("out_of_order_time_window", INGESTER),
    ("prom2_range_compat", QUERIER),
    ("query_ingesters_within", QUERIER),
    ("query_sharding_max_regexp_size_bytes", QUERY_FRONTEND),
    ("query_sharding_max_sharded_queries", QUERY_FRONTEND),
    ("query_sharding_total_shards", QUERY_FRONTEND),
    ("results_cache_ttl", QUERY_FRONTEND),
    ("results_cache_ttl_for_cardinality_query", QUERY_FRONTEND),
    ("results_cache_ttl_for_errors", QUERY_FRONTEND),
    ("results_cache_ttl_for_labels_query", QUERY_FRONTEND),
    (
        "results_cache_ttl_for_out_of_order_time_window",
        QUERY_FRONTEND,
    ),
    ("ruler_alerting_rules_evaluation_enabled", RULER),
    ("ruler_alertmanager_client_config", RULER),
    ("ruler_evaluation_consistency_max_delay", RULER),
    ("ruler_evaluation_delay_duration", RULER),
    (
        "ruler_max_independent_rule_evaluation_concurrency_per_tenant",
        RULER,
    ),
    ("ruler_max_rule_evaluation_concurrency_per_tenant", RULER),
    ("ruler_max_rule_evaluation_results", RULER),
    ("ruler_max_rule_groups_per_tenant", RULER),
    ("ruler_max_rule_groups_per_tenant_by_namespace", RULER),
    ("ruler_max_rules_per_rule_group", RULER),
    ("ruler_max_rules_per_rule_group_by_namespace", RULER),
    ("ruler_min_rule_evaluation_interval", RULER),
    ("ruler_protected_namespaces", RULER),
    ("ruler_recording_rules_evaluation_enabled", RULER),
    ("ruler_sync_rules_on_changes_enabled", RULER),
    ("ruler_tenant_shard_size", RULER),
    ("s3_sse_kms_encryption_context", OBJECT_STORAGE),
    ("s3_sse_kms_key_id", OBJECT_STORAGE),
    ("s3_sse_type", OBJECT_STORAGE),
    ("split_instant_queries_by_interval", QUERY_FRONTEND),
    ("store_gateway_tenant_shard_size", STORE_GATEWAY),
    ("store_gateway_tenant_shard_size_per_zone", STORE_GATEWAY),
    ("subquery_spin_off_enabled", QUERY_FRONTEND),
];

pub(crate) const FORWARDING: &str =
    "Mimir's per-tenant forwarding is not implemented: every admitted push goes to --upstream";
const SHUFFLE_SHARDING: &str = "shuffle sharding does not apply: weir has no ingesters or \
                                partitions, every admitted push goes to --upstream";
const OTLP_TRANSLATION: &str = "OTLP translation option read as its default: weir forwards OTLP \
                                pushes unchanged (docs/mimir-keys.md says what each changes)";
const COST_ATTRIBUTION: &str =
    "cost attribution is not implemented: weir's metrics have no cost-attribution labels";
const DELAY_CONDITIONS: &str = "not implemented: weir applies ingestion_artificial_delay to \
                                every push of the tenant (Mimir 3.0.0's conditional delays, \
                                removed in 3.0.1)";

/// Per-tenant keys a Mimir distributor reads that weir does not enforce, with why and what
/// happens to the pushes instead.
pub(crate) const IGNORED: &[(&str, &str)] = &[
    ("cost_attribution_cooldown", COST_ATTRIBUTION),
    ("cost_attribution_labels", COST_ATTRIBUTION),
    ("cost_attribution_labels_structured", COST_ATTRIBUTION),
    ("forwarding_drop_older_than", FORWARDING),
    ("forwarding_endpoint", FORWARDING),
    ("forwarding_rules", FORWARDING),
    (
        "ingestion_artificial_delay_condition_for_tenants_with_id_greater_than",
        DELAY_CONDITIONS,
    ),
    (
        "ingestion_artificial_delay_condition_for_tenants_with_less_than_max_series",
        DELAY_CONDITIONS,
    ),
    (
        "ingestion_artificial_delay_duration_for_tenants_with_id_greater_than",
        DELAY_CONDITIONS,
    ),
    (
        "ingestion_artificial_delay_duration_for_tenants_with_less_than_max_series",
        DELAY_CONDITIONS,
    ),
    ("ingestion_partitions_tenant_shard_size", SHUFFLE_SHARDING),
    ("ingestion_tenant_shard_size", SHUFFLE_SHARDING),
    (
        "max_active_series_per_user",
        "not implemented: weir does not count series (Mimir applies it with ingest storage)",
    ),
    ("max_cost_attribution_cardinality", COST_ATTRIBUTION),
    (
        "max_cost_attribution_cardinality_per_user",
        COST_ATTRIBUTION,
    ),
    ("max_cost_attribution_labels_per_user", COST_ATTRIBUTION),
    (
        "native_histograms_ingestion_enabled",
        "as Mimir's distributor: native histograms are charged and forwarded whatever its \
         value; Mimir's ingesters drop them when it is false (its distributor only counts them \
         in cortex_distributor_dropped_native_histograms_total, which weir does not export)",
    ),
    (
        "otel_created_timestamp_zero_ingestion_enabled",
        OTLP_TRANSLATION,
    ),
    (
        "separate_metrics_group_label",
        "not implemented: weir's discarded-sample metrics have no group label",
    ),
    (
        "service_overload_status_code_on_rate_limit_enabled",
        "removed in Mimir 3.0, which answers a rate-limited push 429, as weir always does",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn check_table(name: &str, table: &[(&str, &str)]) {
        for pair in table.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "{name}: {:?} must come after {:?} (sorted, no duplicates)",
                pair[0].0,
                pair[1].0
            );
        }
        for (key, text) in table {
            assert!(!text.is_empty(), "{name}: {key} has no component or reason");
        }
    }

    #[test]
    fn tables_are_sorted_and_apart() {
        check_table("NOT_FOR_A_DISTRIBUTOR", NOT_FOR_A_DISTRIBUTOR);
        check_table("IGNORED", IGNORED);
        check_table(
            "SECTIONS_NOT_FOR_A_DISTRIBUTOR",
            SECTIONS_NOT_FOR_A_DISTRIBUTOR,
        );
        for (key, _) in IGNORED {
            assert!(
                lookup(NOT_FOR_A_DISTRIBUTOR, key).is_none(),
                "{key} is in both tables"
            );
        }
    }

    #[test]
    fn lookups() {
        // weir's own keys (HA, validation, ...) are not in the tables at all.
        assert_eq!(limit("accept_ha_samples"), None);
        assert_eq!(limit("ha_tracker_sample_failover_timeout"), None);
        assert_eq!(
            limit("forwarding_endpoint"),
            Some(Standing::Ignored(FORWARDING))
        );
        assert_eq!(
            limit("max_global_series_per_user"),
            Some(Standing::NotForADistributor("ingester"))
        );
        assert_eq!(
            limit("store_gateway_tenant_shard_size"),
            Some(Standing::NotForADistributor("store-gateway"))
        );
        // The first and last key of each table, where an off-by-one would miss.
        assert!(limit("active_series_additional_custom_trackers").is_some());
        assert!(limit("subquery_spin_off_enabled").is_some());
        assert!(limit("service_overload_status_code_on_rate_limit_enabled").is_some());
        // weir's own keys and typos are not Mimir's.
        for key in ["ingestion_rate", "rate_limit_strategy", "ingestion_rat", ""] {
            assert_eq!(limit(key), None, "{key}");
        }
        assert_eq!(
            section("ingester_limits"),
            Some(Standing::NotForADistributor("ingester"))
        );
        assert_eq!(section("overrides"), None);
    }

    /// The operator's table names every key a distributor reads that weir does not enforce.
    #[test]
    fn the_doc_lists_every_ignored_key() {
        let doc = include_str!("../../docs/mimir-keys.md");
        for (key, _) in IGNORED {
            assert!(
                doc.contains(&format!("`{key}`")),
                "docs/mimir-keys.md does not list `{key}`"
            );
        }
    }
}
