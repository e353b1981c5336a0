use super::*;

fn pod(n: u64) -> State {
    State::new(
        PodId::new(n).unwrap(),
        TokenFormat::GitlabV1,
        KeySet::new(),
        None,
        3,
    )
    .unwrap()
}

#[test]
fn tokens_route_here_and_foreign_ones_are_misroutes() {
    let (p2, p3) = (pod(2), pod(3));
    assert_eq!(
        p2.check_registration(p2.registration_token()),
        Owner::Ours(RunnerType::Instance)
    );
    let (id, token) = p2.register().unwrap();
    assert_eq!(p2.runner(&token), Owner::Ours(id));
    let (_, foreign) = p3.register().unwrap();
    assert_eq!(
        p2.runner(&foreign),
        Owner::Misrouted(PodId::new(3).unwrap())
    );
    assert_eq!(p2.runner("glrt-not-a-token"), Owner::Unknown);
    let new = p2.reset_token(&token).unwrap().unwrap();
    assert_eq!(p2.runner(&token), Owner::Unknown);
    assert_eq!(p2.runner(&new), Owner::Ours(id));
    assert!(p2.unregister(&new));
    assert_eq!(p2.runner(&new), Owner::Unknown);
}

#[test]
fn jwt_pods_issue_signed_tokens_routable_to_them() {
    let key = podgate_tokens::keys::generate(podgate_tokens::Algorithm::EdDSA).unwrap();
    let keys = podgate_tokens::keys::keyset_from_generated("sim", &key).unwrap();
    let p = State::new(
        PodId::new(4).unwrap(),
        TokenFormat::Jwt,
        keys.clone(),
        None,
        0,
    )
    .unwrap();
    let (id, token) = p.register().unwrap();
    assert_eq!(p.runner(&token), Owner::Ours(id));
    let job = p.enqueue().unwrap();
    let job_token = p.job(job).unwrap().token;
    for t in [&token, &job_token, &p.registration_token().to_owned()] {
        match Classifier::with_keys(keys.clone()).classify(t) {
            Classification::Routable(i) => assert_eq!(i.pod.get(), 4),
            c => panic!("{t}: {c:?}"),
        }
    }
    // Without a signing key a JWT Pod cannot start.
    assert!(
        State::new(
            PodId::new(4).unwrap(),
            TokenFormat::Jwt,
            KeySet::new(),
            None,
            0
        )
        .is_err()
    );
}

#[test]
fn queue_keys_conflicts_and_job_lifecycle() {
    let p = pod(2).with_job_tag_sets(vec![vec![]]).unwrap();
    let (runner, token) = p.register().unwrap();
    assert!(matches!(p.pick(runner), Pick::Empty));
    // A runner's key is ticked when a job it can take is queued, once it has talked
    // to Rails (`with_recent_runner_queue`).
    let v0 = p.queues().ensure(&token);
    let first = p.enqueue().unwrap();
    assert_eq!(
        p.queues().get(&token),
        Some(v0.clone()),
        "never contacted: not ticked"
    );
    p.heartbeat(runner);
    for _ in 0..3 {
        p.enqueue().unwrap();
    }
    let v1 = p.queues().get(&token).unwrap();
    assert_ne!(v1, v0);
    // Every third pick is a simulated race; the job stays queued.
    assert!(
        matches!(p.pick(runner), Pick::Job(j) if j.id == first && j.state == JobState::Running)
    );
    assert!(matches!(p.pick(runner), Pick::Job(_)));
    assert!(matches!(p.pick(runner), Pick::Conflict));
    assert_eq!(p.queued(), 2);
    let job = p.job(first).unwrap();
    assert_eq!(p.job_by_token(&job.token), Owner::Ours(first));

    assert_eq!(p.append_trace(first, 0, b"hello "), Trace::Ok(6));
    assert_eq!(p.append_trace(first, 3, b"gap"), Trace::RangeMismatch(6));
    assert_eq!(
        p.update(first, JobState::Success, Some(11)),
        Update::Accepted
    );
    assert_eq!(p.append_trace(first, 6, b"world"), Trace::Ok(11));
    assert_eq!(p.update(first, JobState::Success, Some(11)), Update::Ok);
    assert_eq!(
        p.update(first, JobState::Running, None),
        Update::Forbidden(JobState::Success)
    );
    assert_eq!(
        p.append_trace(first, 11, b"x"),
        Trace::Forbidden(JobState::Success)
    );
    assert_eq!(p.update(999, JobState::Running, None), Update::NotFound);
    // A job no runner has picked yet cannot be updated.
    let pending = p.enqueue().unwrap();
    assert_eq!(
        p.update(pending, JobState::Running, None),
        Update::Forbidden(JobState::Pending)
    );
    assert_eq!(p.job(first).unwrap().trace, b"hello world");
    assert_eq!(
        p.dependencies(3).iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[test]
fn specs_name_their_dependencies_which_must_exist() {
    let p = pod(2).with_job_template(JobSpec {
        image: None,
        ..JobSpec::default()
    });
    let a = p.enqueue().unwrap();
    assert_eq!(p.job(a).unwrap().image, None);
    assert_eq!(p.job(a).unwrap().name, format!("build-{a}"));
    let spec = JobSpec {
        name: Some("test".into()),
        dependencies: Some(vec![a]),
        ..JobSpec::default()
    };
    let b = p.enqueue_spec(spec.clone()).unwrap();
    assert_eq!(p.job(b).unwrap().dependencies, vec![a]);
    let missing = JobSpec {
        dependencies: Some(vec![99]),
        ..spec
    };
    assert!(p.enqueue_spec(missing).is_err());
    assert_eq!(p.queued(), 2, "a refused spec queues nothing");
}

#[test]
fn runners_get_only_jobs_they_match_and_only_their_keys_tick() {
    let p = pod(2);
    let projects = p.project_ids();
    assert_eq!(projects.len(), 2);
    let tokens = p.project_registration_tokens();
    assert_eq!(
        p.check_registration(&tokens[1].1),
        Owner::Ours(RunnerType::Project(projects[1]))
    );
    assert_eq!(
        p.check_registration(p.registration_token()),
        Owner::Ours(RunnerType::Instance)
    );
    let spec = |runner_type, tags: &[&str], run_untagged| RunnerSpec {
        runner_type,
        tags: tags.iter().map(|t| (*t).to_owned()).collect(),
        run_untagged,
        ..RunnerSpec::default()
    };
    // run_untagged false needs tags.
    assert!(
        p.register_runner(spec(RunnerType::Instance, &[], false))
            .is_err()
    );
    let (untagged, ut) = p
        .register_runner(spec(RunnerType::Instance, &[], true))
        .unwrap();
    let (docker, dt) = p
        .register_runner(spec(RunnerType::Instance, &["docker", "linux"], false))
        .unwrap();
    let (proj, pt) = p
        .register_runner(spec(RunnerType::Project(projects[1]), &["gpu"], true))
        .unwrap();
    let values = |p: &State| [&ut, &dt, &pt].map(|t| p.queues().ensure(t));
    for id in [untagged, docker, proj] {
        p.heartbeat(id);
    }
    let before = values(&p);
    let gpu = p
        .enqueue_spec(JobSpec {
            tags: vec!["gpu".into()],
            project: Some(projects[0]),
            ..JobSpec::default()
        })
        .unwrap();
    assert_eq!(values(&p), before, "nobody can take a gpu job of project 0");
    let job = p
        .enqueue_spec(JobSpec {
            tags: vec!["gpu".into()],
            project: Some(projects[1]),
            ..JobSpec::default()
        })
        .unwrap();
    let after = values(&p);
    assert_eq!((after[0] == before[0], after[1] == before[1]), (true, true));
    assert_ne!(after[2], before[2], "the project runner's key ticked");
    assert!(matches!(p.pick(untagged), Pick::Empty));
    assert!(matches!(p.pick(docker), Pick::Empty));
    assert!(matches!(p.pick(proj), Pick::Job(j) if j.id == job && j.project == projects[1]));
    assert_eq!(p.queued(), 1);
    assert_eq!(p.job(gpu).unwrap().state, JobState::Pending);
    let docker_job = p
        .enqueue_spec(JobSpec {
            tags: vec!["docker".into()],
            ..JobSpec::default()
        })
        .unwrap();
    assert!(matches!(p.pick(untagged), Pick::Empty));
    assert!(matches!(p.pick(docker), Pick::Job(j) if j.id == docker_job));
    assert!(
        p.enqueue_spec(JobSpec {
            project: Some(5),
            ..JobSpec::default()
        })
        .is_err()
    );
    assert_eq!(p.tick_all(), 3);
}

#[test]
fn generated_jobs_cycle_through_tag_sets_and_projects() {
    let p = pod(3);
    let projects = p.project_ids();
    let got: Vec<(Vec<String>, u64)> = (0..8)
        .map(|_| {
            let j = p.job(p.enqueue().unwrap()).unwrap();
            (j.tags, j.project)
        })
        .collect();
    let sets = default_job_tag_sets();
    for (i, (tags, project)) in got.iter().enumerate() {
        assert_eq!(tags, &sets[i % 4], "job {i}");
        assert_eq!(*project, projects[i / 4], "job {i}");
    }
}

#[test]
fn finished_jobs_past_the_window_are_archived() {
    let p = pod(2).with_job_tag_sets(vec![vec![]]).unwrap();
    let (runner, _) = p.register().unwrap();
    let mut finished = Vec::new();
    while finished.len() < FINISHED_KEPT + 3 {
        p.enqueue().unwrap();
        // Every third pick is a simulated race: pick until a job comes.
        let job = loop {
            if let Pick::Job(j) = p.pick(runner) {
                break j;
            }
        };
        assert_eq!(p.append_trace(job.id, 0, b"line\n"), Trace::Ok(5));
        assert_eq!(p.update(job.id, JobState::Success, Some(5)), Update::Ok);
        finished.push((job.id, job.token));
    }
    // A running job is whole however many have finished.
    p.enqueue().unwrap();
    let running = loop {
        if let Pick::Job(j) = p.pick(runner) {
            break j.id;
        }
    };
    assert_eq!(p.append_trace(running, 0, b"still"), Trace::Ok(5));
    for (n, (id, token)) in finished.iter().enumerate() {
        let job = p.job(*id).unwrap();
        // State, runner, project, trace length and CRC are kept for every job, and
        // its token still names it; the rest for the last ones only.
        assert_eq!(job.state, JobState::Success);
        assert_eq!(job.runner, Some(runner));
        assert_eq!(
            (job.trace_len, job.trace_crc),
            (5, crc32fast::hash(b"line\n"))
        );
        assert_eq!(p.job_by_token(token), Owner::Ours(*id), "job {n}");
        let whole = n >= 3;
        assert_eq!(job.trace == b"line\n", whole, "job {n}");
        assert_eq!(!job.name.is_empty(), whole, "job {n}");
    }
    assert_eq!(p.job(running).unwrap().trace, b"still");
    // The ledger still has every job finished once.
    let (summary, _) = p.ledger();
    assert_eq!(summary.finished_once, finished.len() as u64);
    // An archived job answers late requests as a finished one: no more trace, and a
    // second final state is refused and counted a duplicate.
    let (oldest, _) = finished[0];
    assert_eq!(
        p.append_trace(oldest, 5, b"late"),
        Trace::Forbidden(JobState::Success)
    );
    assert_eq!(
        p.update(oldest, JobState::Failed, Some(5)),
        Update::Forbidden(JobState::Success)
    );
    let (summary, _) = p.ledger();
    assert_eq!(summary.duplicates, 1);
    assert_eq!(summary.finished_once, finished.len() as u64 - 1);
}
