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
        Owner::Ours(())
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
fn queue_tickets_conflicts_and_job_lifecycle() {
    let p = pod(2);
    let t0 = p.ticket();
    assert!(matches!(p.pick(1), Pick::Empty));
    let first = p.enqueue().unwrap();
    for _ in 0..3 {
        p.enqueue().unwrap();
    }
    assert_eq!(p.ticket(), t0 + 4);
    // Every third pick is a simulated race; the job stays queued.
    assert!(matches!(p.pick(1), Pick::Job(j) if j.id == first && j.state == JobState::Running));
    assert!(matches!(p.pick(1), Pick::Job(_)));
    assert!(matches!(p.pick(1), Pick::Conflict));
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
