//! One module per subcommand.

pub mod auto_sizes;
pub mod bench;
pub mod bench_common;
pub mod bench_load;
pub mod bench_overlap;
pub mod bench_reward;
pub mod bench_shapes;
pub mod bench_step;
pub mod config;
pub mod data;
pub mod debug;
pub mod debug_rollout;
pub mod demo;
pub mod env;
pub mod forward;
pub mod launch;
pub mod list;
pub mod make_tiny;
pub mod plan;
pub mod plan_pictures;
pub mod pretrain;
pub mod sample;
pub mod score;
pub mod shapes;
pub mod shapes_log;
pub mod train;
