//! Prompt files written here load with the data crate, tasks intact.

use flowtune_data::PromptDataset;
use flowtune_shapes::{sample_tasks, write_prompts_jsonl, Task};

#[test]
fn written_prompts_load_as_a_dataset_with_their_tasks() {
    let dir = flowtune_fixtures::scratch("shapes");
    let path = dir.join("prompts.jsonl");
    let tasks = sample_tasks(21, 12);
    write_prompts_jsonl(&path, &tasks, "shapes").unwrap();
    let records = PromptDataset::load(&path).unwrap().records;
    assert_eq!(records.len(), tasks.len());
    for (record, task) in records.iter().zip(&tasks) {
        assert_eq!(
            (record.prompt.as_str(), record.data_source.as_str()),
            (task.prompt.as_str(), "shapes")
        );
        assert_eq!(record.ground_truth, None);
        assert_eq!(record.extra_info["category"], task.category.name());
        let stored: Task = serde_json::from_value(record.extra_info["task"].clone()).unwrap();
        assert_eq!(&stored, task);
    }
}
