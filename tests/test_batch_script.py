"""A batch script's #SBATCH lines become slurmrestd's job properties (clusters/slurm/batch.py): read
as sbatch reads them, and refused, never dropped, when the console cannot pass one on. Persona: rosa
writes her scripts by hand."""

import pytest

from clusters.slurm.batch import BatchScriptError, job_properties


def test_it_reads_long_short_and_flag_options_until_the_first_command():
    script = "\n".join(
        [
            "#!/bin/bash",
            "#SBATCH --job-name=train --partition cpu",
            "#SBATCH -N 2 -n4",
            "# a comment between directives is fine",
            "",
            "#SBATCH --ntasks-per-node=2 --cpus-per-task 3",
            "#SBATCH --nodelist=cpu-[0-1] --exclude cpu-2",
            "#SBATCH -t 1:30:00 -o /home/out-%j.out -e=/home/err-%j.out",
            "#SBATCH --mem=4G --exclusive --requeue",
            "#SBATCH --open-mode=append --reservation=tcc-scan  # trailing comment",
            "srun hostname",
            "#SBATCH --nodes=9",  # after the first command: a comment, as sbatch reads it
        ]
    )
    assert job_properties(script) == {
        "name": "train",
        "partition": "cpu",
        "nodes": "2",
        "tasks": 4,
        "tasks_per_node": 2,
        "cpus_per_task": 3,
        "nodelist": "cpu-[0-1]",
        "exclude_nodes": "cpu-2",
        "time_limit": "1:30:00",
        "standard_output": "/home/out-%j.out",
        "standard_error": "/home/err-%j.out",
        "memory_per_node": 4096,
        "exclusive": "exclusive",
        "requeue": True,
        "open_mode": "append",
        "reservation": "tcc-scan",
    }


def test_mem_0_asks_for_all_of_each_nodes_memory_not_one_megabyte():
    """sbatch(1): --mem=0 gives the job all the memory of each node (what a GPU run's script asks for).
    It became memory_per_node 1 (a rounding-up floor), which Slurm would enforce as a 1 MB limit."""
    assert job_properties("#SBATCH --mem=0 --exclusive\n")["memory_per_node"] == 0
    assert job_properties("#SBATCH --mem=1K\n")["memory_per_node"] == 1  # a small request still rounds up


def test_the_last_of_requeue_and_no_requeue_wins_and_exclusive_takes_a_value():
    assert job_properties("#SBATCH --requeue\n#SBATCH --no-requeue --exclusive=user\n") == {
        "no_requeue": True,
        "exclusive": "user",
    }
    assert job_properties("#SBATCH --no-requeue\n#SBATCH --requeue\n") == {"requeue": True}


@pytest.mark.parametrize(
    "line, message",
    [
        ("#SBATCH --mail-type=END", "line 2: #SBATCH --mail-type is not an option the console can submit"),
        ("#SBATCH -Z", "line 2: #SBATCH -Z is not an option"),
        ("#SBATCH --ntasks=four", "must be a whole number"),
        ("#SBATCH --mem=lots", "memory must be a number"),
        ("#SBATCH --partition", "needs a value"),
        ("#SBATCH nodes=2", "is not an option"),
    ],
)
def test_rosa_hears_which_line_the_console_cannot_pass_on(line, message):
    with pytest.raises(BatchScriptError, match=message):
        job_properties(f"#!/bin/bash\n{line}\nhostname\n")
