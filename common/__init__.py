"""What every package of the controller shares and that depends on nothing of the project: the domain
errors with their exit codes (:mod:`common.errors`) and the wording helpers of messages (:mod:`common.text`)."""
