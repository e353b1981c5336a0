//! Which runner may take which job: GitLab's `Gitlab::Ci::Matching::RunnerMatcher`
//! (`lib/gitlab/ci/matching/runner_matcher.rb`) and `BuildMatcher`, plus the runner
//! types of `Ci::Runner` (`app/models/ci/runner.rb`) and the tag lists Grape and
//! acts-as-taggable-on build from a registration.

use serde_json::Value;

/// `Ci::Runner#runner_type`, as the registration token decides it
/// (`Ci::Runners::RegisterRunnerService`): the instance registration token makes an
/// instance runner, a project's registration token a runner of that project.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunnerType {
    /// `instance_type`: runs jobs of every project.
    Instance,
    /// `project_type`: runs only this project's jobs.
    Project(u64),
}

impl RunnerType {
    /// GitLab's name (`instance_type`, `project_type`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerType::Instance => "instance_type",
            RunnerType::Project(_) => "project_type",
        }
    }
}

/// `Ci::Runner#access_level` (`enum access_level: { not_protected: 0, ref_protected: 1 }`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AccessLevel {
    /// Runs jobs of any ref.
    #[default]
    NotProtected,
    /// Runs only jobs of protected refs.
    RefProtected,
}

impl AccessLevel {
    /// The level named `s` (Grape: `values: ::Ci::Runner.access_levels.keys`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "not_protected" => Some(AccessLevel::NotProtected),
            "ref_protected" => Some(AccessLevel::RefProtected),
            _ => None,
        }
    }
}

/// What a runner accepts (`Gitlab::Ci::Matching::RunnerMatcher`). Tags are kept sorted
/// and unique, so equal matchers compare equal and runners can be grouped by them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunnerMatcher {
    /// Instance or project runner.
    pub runner_type: RunnerType,
    /// Its tags, sorted.
    pub tags: Vec<String>,
    /// Whether it runs jobs without tags.
    pub run_untagged: bool,
    /// Protected refs only, or any.
    pub access_level: AccessLevel,
}

/// What a job asks of a runner (`Gitlab::Ci::Matching::BuildMatcher`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BuildMatcher {
    /// The job's project.
    pub project: u64,
    /// The job's tags, sorted.
    pub tags: Vec<String>,
    /// Whether the job's ref is protected.
    pub protected: bool,
}

fn sorted(tags: &[String]) -> Vec<String> {
    let mut t = tags.to_vec();
    t.sort();
    t.dedup();
    t
}

impl RunnerMatcher {
    /// A matcher for a runner with these attributes.
    pub fn new(
        runner_type: RunnerType,
        tags: &[String],
        run_untagged: bool,
        access_level: AccessLevel,
    ) -> Self {
        RunnerMatcher {
            runner_type,
            tags: sorted(tags),
            run_untagged,
            access_level,
        }
    }

    /// `RunnerMatcher#matches?`: a protected-only runner takes protected jobs only, and
    /// `(run_untagged || build_matcher.has_tags?) && (build_matcher.tag_list -
    /// tag_list).empty?`. A project runner takes only its project's jobs (the runners
    /// a job may go to are `build.project.all_available_runners`: the instance
    /// runners and the project's own).
    pub fn matches(&self, build: &BuildMatcher) -> bool {
        if let RunnerType::Project(p) = self.runner_type
            && p != build.project
        {
            return false;
        }
        if self.access_level == AccessLevel::RefProtected && !build.protected {
            return false;
        }
        (self.run_untagged || !build.tags.is_empty())
            && build
                .tags
                .iter()
                .all(|t| self.tags.binary_search(t).is_ok())
    }
}

impl BuildMatcher {
    /// A matcher for a job of `project` with `tags`.
    pub fn new(project: u64, tags: &[String], protected: bool) -> Self {
        BuildMatcher {
            project,
            tags: sorted(tags),
            protected,
        }
    }
}

/// `API::Validations::Types::CommaSeparatedToArray.coerce`
/// (`lib/api/validations/types/comma_separated_to_array.rb`), which registration's
/// `optional :tag_list, type: Array[String], coerce_with: …` uses: a string is split
/// on `,` and each part stripped; an array has each element split the same way;
/// anything else is `[]`. Then the runner's `tag_list=` (acts-as-taggable-on
/// `TagList#clean!`) drops blank tags and repeats.
pub fn tag_list(value: &Value) -> Vec<String> {
    let parts: Vec<String> = match value {
        Value::String(s) => split(s),
        Value::Array(items) => items
            .iter()
            .flat_map(|v| match v {
                Value::String(s) => split(s),
                // Ruby's `to_s` of a number or boolean, and of nil ("").
                Value::Number(n) => split(&n.to_string()),
                Value::Bool(b) => split(&b.to_string()),
                Value::Null => Vec::new(),
                other => split(&other.to_string()),
            })
            .collect(),
        _ => Vec::new(),
    };
    clean(parts)
}

fn split(s: &str) -> Vec<String> {
    s.split(',').map(|p| p.trim().to_owned()).collect()
}

/// acts-as-taggable-on `TagList#clean!`: blank tags dropped, the rest stripped and
/// unique, in order.
pub fn clean(tags: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in tags {
        let t = t.trim().to_owned();
        if !t.is_empty() && !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn runner_matcher_rules() {
        let build = |p, t: &[&str]| BuildMatcher::new(p, &tags(t), true);
        let untagged =
            RunnerMatcher::new(RunnerType::Instance, &[], true, AccessLevel::NotProtected);
        assert!(untagged.matches(&build(1, &[])));
        assert!(!untagged.matches(&build(1, &["docker"])));
        let docker = RunnerMatcher::new(
            RunnerType::Instance,
            &tags(&["linux", "docker"]),
            false,
            AccessLevel::NotProtected,
        );
        assert!(!docker.matches(&build(1, &[])), "run_untagged false");
        assert!(docker.matches(&build(1, &["docker"])));
        assert!(docker.matches(&build(2, &["docker", "linux"])));
        assert!(!docker.matches(&build(1, &["docker", "gpu"])));
        let project = RunnerMatcher::new(
            RunnerType::Project(7),
            &tags(&["gpu"]),
            true,
            AccessLevel::NotProtected,
        );
        assert!(project.matches(&build(7, &[])));
        assert!(project.matches(&build(7, &["gpu"])));
        assert!(!project.matches(&build(8, &[])), "another project's job");
        let protected =
            RunnerMatcher::new(RunnerType::Instance, &[], true, AccessLevel::RefProtected);
        assert!(!protected.matches(&BuildMatcher::new(1, &[], false)));
        assert!(protected.matches(&BuildMatcher::new(1, &[], true)));
    }

    #[test]
    fn tag_lists_as_grape_coerces_them() {
        assert_eq!(tag_list(&json!("a, b,,a ,c")), tags(&["a", "b", "c"]));
        assert_eq!(
            tag_list(&json!(["a,b", " c ", 1, null])),
            tags(&["a", "b", "c", "1"])
        );
        assert_eq!(tag_list(&json!({"a": "b"})), Vec::<String>::new());
        assert_eq!(tag_list(&json!("")), Vec::<String>::new());
        assert_eq!(
            AccessLevel::parse("ref_protected"),
            Some(AccessLevel::RefProtected)
        );
        assert_eq!(AccessLevel::parse("x"), None);
    }
}
