//! Prost types generated from the OpenTelemetry protocol's metrics contract
//! (`proto/opentelemetry/`, vendored unmodified with its licence), nested as their packages.

#![allow(clippy::all, missing_docs)]

pub mod opentelemetry {
    pub mod proto {
        pub mod collector {
            pub mod metrics {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.collector.metrics.v1.rs"
                    ));
                }
            }
        }
        pub mod metrics {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.metrics.v1.rs"
                ));
            }
        }
        pub mod common {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.common.v1.rs"
                ));
            }
        }
        pub mod resource {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.resource.v1.rs"
                ));
            }
        }
    }
}

pub use opentelemetry::proto::collector::metrics::v1::ExportMetricsServiceRequest;
pub use opentelemetry::proto::common::v1 as common;
pub use opentelemetry::proto::metrics::v1 as metrics;
pub use opentelemetry::proto::resource::v1 as resource;
